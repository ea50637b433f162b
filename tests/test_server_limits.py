"""Per-key limits (issue 26): a request rate, and caps on open streams and active runs, each answered with
429 `rate_limited` and `Retry-After` (server-contract.md §2). A real uvicorn on loopback, SQLite (the
limits live in the process, not the store)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from ringlet import Agent
from ringlet.server import ServerSettings, create_app
from ringlet.server.http.errors import ApiError
from ringlet.server.http.limits import Cap, Limits, RequestRate, TokenBucket
from ringlet.store import Store
from ringlet.testing import FunctionModel
from serving import serving
from test_server import Gate


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def server(tmp_path: Path, gate: Gate | None = None, **settings: Any) -> AsyncIterator[Any]:
    """A served app with `settings`; yields (url, store, runner) with the runner's limits on a hand clock."""
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}")
    agents = [Agent(FunctionModel(lambda request: "hello"), name="echo"),
              Agent(FunctionModel((gate or Gate()).stream), name="slow")]
    app = create_app(ServerSettings(ping_interval_s=0.2, **settings), store=store, agents=agents)
    try:
        async with serving(app) as url:
            async with httpx.AsyncClient(base_url=url) as c:
                assert (await c.get("/healthz")).status_code == 200  # answered once the app has started
            runner = app.state.ringlet.runner
            runner.here.limits.rate.clock = Clock()
            yield url, store, runner
    finally:
        await store.close()


async def key(store: Store, name: str) -> tuple[dict[str, str], str]:
    """Headers for a new chat key, and its id."""
    secret, record = await store.keys.create(name, scopes=["chat"])
    return {"Authorization": f"Bearer {secret}"}, record.id


def assert_rate_limited(response: httpx.Response, limit: str, retry_after: int | None = None) -> dict[str, Any]:
    assert response.status_code == 429, response.text
    seconds = int(response.headers["Retry-After"])
    assert seconds >= 1
    if retry_after is not None:
        assert seconds == retry_after
    error = response.json()["error"]
    assert error["code"] == "rate_limited"
    assert error["request_id"] == response.headers["x-request-id"]
    assert error["details"] == {"limit": limit, "retry_after_s": seconds}
    return error


def watch_release(cap: Cap) -> asyncio.Event:
    """Set whenever `cap` releases a holder (the server noticed a stream or run end)."""
    released, release = asyncio.Event(), cap.release

    def spy(holder: object) -> None:
        release(holder)
        released.set()

    cap.release = spy  # type: ignore[method-assign]
    return released


# -- the pieces ------------------------------------------------------------------------------------------------


def test_token_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=0.5, burst=2, clock=clock)
    assert [bucket.take(), bucket.take()] == [0.0, 0.0]  # it starts full
    assert bucket.take() == 2.0  # one token every 2 s; a refusal takes nothing
    clock.now += 1.5
    assert bucket.take() == pytest.approx(0.5)
    clock.now += 0.5
    assert bucket.take() == 0.0
    clock.now += 3600  # an idle hour refills it to the burst, no more
    assert [bucket.take(), bucket.take()] == [0.0, 0.0]
    assert bucket.take() > 0


def test_caps_count_per_key_and_release_once() -> None:
    cap = Cap(2, "open event streams", "max_streams_per_key", "close one")
    a1, a2 = cap.hold("a"), cap.hold("a")
    with pytest.raises(ApiError) as refused:
        cap.hold("a")
    assert (refused.value.status, refused.value.code) == (429, "rate_limited")
    assert refused.value.headers == {"Retry-After": "5"}
    assert "key a already has 2 open event streams" in str(refused.value)
    cap.hold("b")  # another key is not affected
    a1.release()
    a1.release()  # a second release frees nothing more
    assert cap.held("a") == 1
    cap.hold("a")
    a2.release()
    unlimited = Cap(0, "active runs", "max_runs_per_key", "wait")
    for i in range(50):
        unlimited.hold("a", f"r_{i}")
    assert unlimited.held("a") == 50


def test_zero_turns_the_request_rate_off() -> None:
    rate = RequestRate(per_minute=0, burst=1)
    for _ in range(1000):
        rate.admit("a")
    assert rate.buckets == {}


def test_full_buckets_are_dropped_when_many_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    rate = RequestRate(per_minute=60, burst=5, clock=clock)
    monkeypatch.setattr(RequestRate, "PRUNE_AT", 3)
    for name in ("a", "b", "c"):
        rate.admit(name)
    clock.now += 1  # a, b and c have refilled
    rate.admit("d")
    assert set(rate.buckets) == {"d"}


def test_settings_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    keyed = Limits.of(ServerSettings())
    assert (keyed.rate.per_minute, keyed.rate.burst, keyed.streams.limit, keyed.runs.limit) == (1200, 300, 200, 50)
    local = Limits.of(ServerSettings(auth_mode="none"))  # development mode: none unless set
    assert (local.rate.per_minute, local.streams.limit, local.runs.limit) == (0, 0, 0)
    monkeypatch.setenv("RINGLET_RATE_LIMIT_PER_MINUTE", "30")
    monkeypatch.setenv("RINGLET_RATE_LIMIT_BURST", "4")
    monkeypatch.setenv("RINGLET_MAX_STREAMS_PER_KEY", "0")
    monkeypatch.setenv("RINGLET_MAX_RUNS_PER_KEY", "3")
    limits = Limits.of(ServerSettings.from_env())
    assert (limits.rate.per_minute, limits.rate.burst, limits.streams.limit, limits.runs.limit) == (30, 4, 0, 3)


# -- over HTTP ----------------------------------------------------------------------------------------------------


async def test_past_the_request_rate_a_key_gets_429_with_retry_after(tmp_path: Path) -> None:
    async with server(tmp_path, rate_limit_per_minute=6, rate_limit_burst=2) as (url, store, runner), \
            httpx.AsyncClient(base_url=url) as c:
        a, a_id = await key(store, "a")
        b, _ = await key(store, "b")
        assert [(await c.get("/api/v1/agents", headers=a)).status_code for _ in range(2)] == [200, 200]
        refused = await c.get("/api/v1/agents", headers=a)
        error = assert_rate_limited(refused, "rate_limit_per_minute", retry_after=10)  # 6 a minute: 1 per 10 s
        assert f"key {a_id} may send 6 requests a minute, 2 at once" in error["message"]
        assert (await c.post("/api/v1/chat/conversations", headers=a, json={"agent": "echo"})).status_code == 429
        assert (await c.get("/api/v1/agents", headers=b)).status_code == 200  # another key is not affected
        assert (await c.get("/v1/models", headers=a)).status_code == 429  # /v1 too, in OpenAI's shape
        openai = await c.get("/v1/models", headers=a)
        assert openai.json()["error"]["type"] == "rate_limit_error"
        assert openai.headers["Retry-After"] == "10"
        for path in ("/healthz", "/readyz", "/", "/openapi.json"):  # not limited (and not authenticated)
            assert (await c.get(path)).status_code == 200, path
        assert (await c.get("/api/v1/agents", headers={"Authorization": "Bearer rk_nope"})).status_code == 401
        runner.here.limits.rate.clock.now += 9.2
        assert_rate_limited(await c.get("/api/v1/agents", headers=a), "rate_limit_per_minute", retry_after=1)
        runner.here.limits.rate.clock.now += 0.8  # a token again
        assert (await c.get("/api/v1/agents", headers=a)).status_code == 200
        assert (await c.get("/api/v1/agents", headers=a)).status_code == 429


async def test_development_mode_is_limited_per_principal_local(tmp_path: Path) -> None:
    async with server(tmp_path, auth_mode="none", rate_limit_per_minute=60, rate_limit_burst=1) as (url, _, _), \
            httpx.AsyncClient(base_url=url) as c:
        assert (await c.get("/api/v1/agents")).status_code == 200
        error = assert_rate_limited(await c.get("/api/v1/agents"), "rate_limit_per_minute", retry_after=1)
        assert "key local may send 60 requests a minute" in error["message"]


async def test_a_stream_token_request_counts_against_its_key(tmp_path: Path) -> None:
    async with server(tmp_path, rate_limit_per_minute=60, rate_limit_burst=3) as (url, store, _), \
            httpx.AsyncClient(base_url=url) as c:
        a, _ = await key(store, "a")
        cid = (await c.post("/api/v1/chat/conversations", headers=a, json={"agent": "echo"})).json()["id"]
        token = (await c.post("/api/v1/stream-tokens", headers=a)).json()["token"]
        async with c.stream("GET", f"/api/v1/chat/conversations/{cid}/events?stream_token={token}") as stream:
            assert stream.status_code == 200
        assert (await c.get("/api/v1/agents", headers=a)).status_code == 429  # the 4th request of key a


async def test_open_streams_are_capped_per_key(tmp_path: Path) -> None:
    async with server(tmp_path, max_streams_per_key=2) as (url, store, runner), \
            httpx.AsyncClient(base_url=url, timeout=30) as c:
        a, a_id = await key(store, "a")
        b, _ = await key(store, "b")
        cid = (await c.post("/api/v1/chat/conversations", headers=a, json={"agent": "echo"})).json()["id"]
        bid = (await c.post("/api/v1/chat/conversations", headers=b, json={"agent": "echo"})).json()["id"]
        events = f"/api/v1/chat/conversations/{cid}/events"
        released = watch_release(runner.here.limits.streams)
        first = await c.send(c.build_request("GET", events, headers=a), stream=True)
        async with c.stream("GET", events, headers=a) as second:
            assert (first.status_code, second.status_code) == (200, 200)
            assert runner.here.limits.streams.held(a_id) == 2
            third = await c.get(events, headers=a)
            error = assert_rate_limited(third, "max_streams_per_key", retry_after=5)
            assert f"key {a_id} already has 2 open event streams" in error["message"]
            refused = await c.post(f"/api/v1/chat/conversations/{cid}/messages", headers=a, json={"content": "hi"})
            assert_rate_limited(refused, "max_streams_per_key")  # a message's stream counts the same
            detail = (await c.get(f"/api/v1/chat/conversations/{cid}", headers=a)).json()
            assert (detail["messages"], detail["conversation"]["status"]) == ([], "idle")  # refused before it ran
            async with c.stream("GET", f"/api/v1/chat/conversations/{bid}/events", headers=b) as other:
                assert other.status_code == 200  # another key is not affected
            await first.aclose()  # the client leaves: the server notices and frees the place
            await asyncio.wait_for(_until(lambda: runner.here.limits.streams.held(a_id) == 1, released), 10)
            async with aconnect_sse(c, "GET", events, headers=a) as again:
                assert again.response.status_code == 200
                assert runner.here.limits.streams.held(a_id) == 2
        await asyncio.wait_for(_until(lambda: runner.here.limits.streams.held(a_id) == 0, released), 10)


async def _until(done: Callable[[], bool], changed: asyncio.Event) -> None:
    """Wait until `done()`, re-checking whenever `changed` is set."""
    while not done():
        changed.clear()
        await changed.wait()


async def test_a_refused_openai_stream_stops_its_run(tmp_path: Path) -> None:
    async with server(tmp_path, max_streams_per_key=1) as (url, store, runner), \
            httpx.AsyncClient(base_url=url, timeout=30) as c:
        a, a_id = await key(store, "a")
        cid = (await c.post("/api/v1/chat/conversations", headers=a, json={"agent": "echo"})).json()["id"]
        runs = watch_release(runner.here.limits.runs)
        async with c.stream("GET", f"/api/v1/chat/conversations/{cid}/events", headers=a):
            refused = await c.post("/v1/chat/completions", headers=a, json={
                "model": "echo", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
            assert refused.status_code == 429
            assert refused.headers["Retry-After"] == "5"
            assert refused.json()["error"]["code"] == "rate_limited"
            assert refused.json()["error"]["type"] == "rate_limit_error"
            await asyncio.wait_for(_until(lambda: runner.here.limits.runs.held(a_id) == 0, runs), 10)
            plain = await c.post("/v1/chat/completions", headers=a, json={  # not a stream: not counted
                "model": "echo", "messages": [{"role": "user", "content": "hi"}]})
            assert plain.status_code == 200, plain.text
        await asyncio.wait_for(_until(lambda: runner.here.limits.streams.held(a_id) == 0, watch_release(
            runner.here.limits.streams)), 10)
        async with c.stream("POST", "/v1/chat/completions", headers=a, json={
                "model": "echo", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as ok:
            assert ok.status_code == 200
            assert "[DONE]" in (await ok.aread()).decode()


async def test_active_runs_are_capped_per_key(tmp_path: Path) -> None:
    gate = Gate()
    async with server(tmp_path, gate, max_runs_per_key=1) as (url, store, runner), \
            httpx.AsyncClient(base_url=url, timeout=30) as c:
        a, a_id = await key(store, "a")
        b, _ = await key(store, "b")
        first, second, third = [
            (await c.post("/api/v1/chat/conversations", headers=h, json={"agent": "slow"})).json()["id"]
            for h in (a, a, b)]
        async with aconnect_sse(c, "POST", f"/api/v1/chat/conversations/{first}/messages", headers=a,
                                json={"content": "go"}) as running:
            await gate.entered.wait()
            assert runner.here.limits.runs.held(a_id) == 1
            refused = await c.post(f"/api/v1/chat/conversations/{second}/messages", headers=a,
                                   json={"content": "go"})
            error = assert_rate_limited(refused, "max_runs_per_key", retry_after=5)
            assert f"key {a_id} already has 1 active runs" in error["message"]
            detail = (await c.get(f"/api/v1/chat/conversations/{second}", headers=a)).json()
            assert (detail["conversation"]["status"], detail["messages"]) == ("idle", [])  # nothing stored
            openai = await c.post("/v1/chat/completions", headers=a, json={  # /v1 runs count too
                "model": "echo", "messages": [{"role": "user", "content": "hi"}]})
            assert openai.status_code == 429
            assert openai.json()["error"]["type"] == "rate_limit_error"
            async with aconnect_sse(c, "POST", f"/api/v1/chat/conversations/{third}/messages", headers=b,
                                    json={"content": "go"}) as other:
                assert other.response.status_code == 200  # another key is not affected
                gate.open.set()
                assert [e.event async for e in other.aiter_sse()][-1] == "message_end"
            assert [e.event async for e in running.aiter_sse()][-1] == "message_end"
        assert runner.here.limits.runs.held(a_id) == 0  # freed before message_end was sent
        again = await c.post(f"/api/v1/chat/conversations/{second}/messages", headers={
            **a, "Accept": "application/json"}, json={"content": "go"})
        assert again.status_code == 200, again.text
        assert again.json()["status"] == "completed"


async def test_zero_means_unlimited(tmp_path: Path) -> None:
    async with server(tmp_path, rate_limit_per_minute=0, rate_limit_burst=1, max_streams_per_key=0,
                      max_runs_per_key=0) as (url, store, runner), httpx.AsyncClient(base_url=url, timeout=30) as c:
        a, a_id = await key(store, "a")
        for _ in range(5):  # past the burst
            assert (await c.get("/api/v1/agents", headers=a)).status_code == 200
        cid = (await c.post("/api/v1/chat/conversations", headers=a, json={"agent": "echo"})).json()["id"]
        async with c.stream("GET", f"/api/v1/chat/conversations/{cid}/events", headers=a) as s1, \
                c.stream("GET", f"/api/v1/chat/conversations/{cid}/events", headers=a) as s2:
            assert (s1.status_code, s2.status_code) == (200, 200)
            assert runner.here.limits.streams.held(a_id) == 2
        assert (await c.post(f"/api/v1/chat/conversations/{cid}/messages", headers={
            **a, "Accept": "application/json"}, json={"content": "hi"})).status_code == 200


async def test_signed_webhook_deliveries_count_against_the_triggers_rate(tmp_path: Path) -> None:
    import hashlib
    import hmac
    import time

    secret = "a-webhook-secret-of-length"
    async with server(tmp_path, rate_limit_per_minute=6, rate_limit_burst=1) as (url, store, _), \
            httpx.AsyncClient(base_url=url) as c:
        admin, _ = await store.keys.create("admin", scopes=["admin"])
        made = await c.post("/api/v1/triggers", headers={"Authorization": f"Bearer {admin}"},
                            json={"name": "hook", "agent": "echo", "kind": "webhook", "secret": secret})
        fire = f"/api/v1/triggers/{made.json()['id']}/fire"

        def signed(body: bytes) -> dict[str, str]:
            stamp = str(int(time.time()))
            mac = hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
            return {"X-Ringlet-Signature": f"sha256={mac}", "X-Ringlet-Timestamp": stamp}

        assert (await c.post(fire, content=b'{"n": 1}', headers=signed(b'{"n": 1}'))).status_code == 202
        assert_rate_limited(await c.post(fire, content=b'{"n": 2}', headers=signed(b'{"n": 2}')),
                            "rate_limit_per_minute")
