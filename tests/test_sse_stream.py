"""The SSE response (`server/http/sse.py` `Stream`): frames sent in order from the request's task, and each way a
stream ends — its source ends, the client leaves, the key is revoked, a client stops reading, the server
stops — ends it once, closes its source and frees its stream slot."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from processes import free_port
from ringlet.server.http import sse
from ringlet.server.http.limits import Slot
from ringlet.server.runs import follow
from test_recovery import ringlet_serve


class Client:
    """The ASGI side of one request: what was sent, and a receive that says http.disconnect when told."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.gone = asyncio.Event()
        self.got_body = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body":
            self.got_body.set()

    @property
    def body(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]

    @property
    def ended(self) -> bool:
        return bool(self.sent) and self.sent[-1].get("more_body") is False


class Source:
    """Frames a test feeds in one at a time; records whether its generator was closed."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.closed = False

    async def frames(self) -> AsyncIterator[bytes]:
        try:
            while (frame := await self.queue.get()) is not None:
                yield frame
        finally:
            self.closed = True


class Released(Slot):
    def __init__(self) -> None:
        self.count = 0

    def release(self) -> None:
        self.count += 1


def stream(source: Source, **kwargs: Any) -> tuple[sse.Stream, Released]:
    slot = Released()
    return sse.response(source.frames(), slot, **kwargs), slot


SCOPE = {"type": "http", "method": "GET"}


def test_a_frame_is_encoded_once_with_every_data_line_prefixed() -> None:
    assert sse.encode("delta", '{"a": 1}', "7", retry=3000) == b'id: 7\nretry: 3000\nevent: delta\ndata: {"a": 1}\n\n'
    assert sse.encode("note", "one\ntwo") == b"event: note\ndata: one\ndata: two\n\n"
    assert follow.frame(None) == b"event: ping\ndata: {}\n\n"


async def test_frames_go_out_in_order_then_the_end() -> None:
    source, client = Source(), Client()
    response, slot = stream(source)
    for frame in (b"a", b"b", None):
        source.queue.put_nowait(frame)
    await response(SCOPE, client.receive, client.send)
    assert client.sent[0]["type"] == "http.response.start"
    assert dict(client.sent[0]["headers"])[b"content-type"].startswith(b"text/event-stream")
    assert b"content-length" not in dict(client.sent[0]["headers"])
    assert (client.body, client.ended, source.closed, slot.count) == ([b"a", b"b", b""], True, True, 1)


async def test_a_client_that_leaves_ends_the_stream_and_frees_its_slot() -> None:
    source, client = Source(), Client()
    response, slot = stream(source)
    source.queue.put_nowait(b"a")
    task = asyncio.create_task(response(SCOPE, client.receive, client.send))
    await client.got_body.wait()
    client.gone.set()
    await asyncio.wait_for(task, 5)
    assert (client.body, client.ended, source.closed, slot.count) == ([b"a"], False, True, 1)


async def test_a_revoked_key_gets_its_last_frame_and_the_end() -> None:
    source, client = Source(), Client()
    checks: list[int] = []

    async def still_valid() -> bytes | None:
        checks.append(1)
        return None if len(checks) < 3 else b"event: error\ndata: {}\n\n"

    response, slot = stream(source, still_valid=still_valid, every=0.01)
    source.queue.put_nowait(b"a")
    await asyncio.wait_for(response(SCOPE, client.receive, client.send), 5)
    assert (client.body, client.ended, source.closed, slot.count) == ([b"a", b"event: error\ndata: {}\n\n", b""],
                                                                      True, True, 1)
    assert len(checks) == 3


async def test_a_failed_recheck_keeps_the_stream_and_checks_again() -> None:
    source, client = Source(), Client()
    calls: list[int] = []

    async def still_valid() -> bytes | None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("the store is away")
        source.queue.put_nowait(None)  # checked again after the failure: the source ends
        return None

    response, _ = stream(source, still_valid=still_valid, every=0.01)
    await asyncio.wait_for(response(SCOPE, client.receive, client.send), 5)
    assert (client.body, client.ended, len(calls) >= 2) == ([b""], True, True)


async def test_a_client_that_reads_nothing_is_let_go(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sse, "SEND_TIMEOUT_S", 0.05)
    source, client = Source(), Client()
    stuck = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            await stuck.wait()  # its socket buffer is full
        client.sent.append(message)

    response, slot = stream(source)
    source.queue.put_nowait(b"a")
    await asyncio.wait_for(response(SCOPE, client.receive, send), 5)
    assert (source.closed, slot.count) == (True, 1)


async def test_close_all_ends_open_streams_with_their_end() -> None:
    sources, clients = [Source(), Source()], [Client(), Client()]
    tasks = []
    for source, client in zip(sources, clients, strict=True):
        source.queue.put_nowait(b"a")
        response, _ = stream(source)
        tasks.append(asyncio.create_task(response(SCOPE, client.receive, client.send)))
        await client.got_body.wait()
    sse.close_all()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert [(c.body, c.ended) for c in clients] == [([b"a", b""], True)] * 2
    assert all(s.closed for s in sources)


async def test_head_sends_no_frames() -> None:
    source, client = Source(), Client()
    response, slot = stream(source)
    await response({"type": "http", "method": "HEAD"}, client.receive, client.send)
    assert (client.body, client.ended, slot.count) == ([b""], True, 1)


async def test_a_cancelled_request_is_not_taken_for_the_stream_ending() -> None:
    source, client = Source(), Client()
    response, slot = stream(source)
    source.queue.put_nowait(b"a")
    task = asyncio.create_task(response(SCOPE, client.receive, client.send))
    await client.got_body.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (client.ended, source.closed, slot.count) == (False, True, 1)


@pytest.mark.slow
async def test_sigterm_ends_open_streams_so_the_server_stops_at_once(tmp_path: Path) -> None:
    agent = tmp_path / "agents" / "talker"
    agent.mkdir(parents=True)
    (agent / "config.yaml").write_text("model: openai:m\nmodel_options: {base_url: 'http://127.0.0.1:9/v1', "
                                       "api_key: x}\ninstructions: Talk.\n")
    port = free_port()
    async with ringlet_serve(port, tmp_path / "ringlet.db", tmp_path / "agents",
                             RINGLET_PING_INTERVAL_S="0.1") as server, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
        cid = (await c.post("/api/v1/chat/conversations", json={"agent": "talker"})).json()["id"]
        async with c.stream("GET", f"/api/v1/chat/conversations/{cid}/events") as events:
            assert events.status_code == 200
            lines = events.aiter_lines()
            assert await anext(lines) == "retry: 3000"  # the first frame (a ping) is here: the stream is open
            started = time.monotonic()
            server.send_signal(signal.SIGTERM)
            async for _ in lines:  # the stream ends (the graceful timeout is 15 s)
                pass
        assert await asyncio.wait_for(server.wait(), 10) == -signal.SIGTERM  # uvicorn re-raises it, once stopped
        assert time.monotonic() - started < 5


def test_a_response_dropped_unsent_frees_its_slot() -> None:
    source = Source()
    response, slot = stream(source)
    assert slot.count == 0
    del response  # an error after the response was made: it is never sent
    assert slot.count == 1


async def test_on_left_is_called_only_when_the_client_leaves() -> None:
    """`on_left` (the AI SDK route cancels its run there): a client leaving, or reading nothing, calls it;
    the source's end, a revoked key and the server stopping do not."""
    calls: list[str] = []

    async def ended(how: str, **kwargs: Any) -> None:
        source, client = Source(), Client()
        response, _ = stream(source, on_left=lambda: calls.append(how), **kwargs)
        source.queue.put_nowait(b"a")
        task = asyncio.create_task(response(SCOPE, client.receive, client.send))
        await client.got_body.wait()
        if how == "left":
            client.gone.set()
        elif how == "end":
            source.queue.put_nowait(None)
        elif how == "shutdown":
            sse.close_all()
        await asyncio.wait_for(task, 5)

    async def revoked() -> bytes | None:
        return b"event: error\ndata: {}\n\n"

    for how in ("end", "shutdown", "left"):
        await ended(how)
    await ended("revoked", still_valid=revoked, every=0.01)
    assert calls == ["left"]
