"""Evals on the server (issue 41, item 5): the reports in `evals_dir` over the API, and a stored conversation
captured as a case; a real uvicorn on loopback, real HTTP, the store on SQLite."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, expect

from browser import IN_SESSION_LOOP
from ringlet import Agent, tool
from ringlet.evals import CaseReport, CaseRun, Dataset, NoError, Report, Result, ToolCalled
from ringlet.messages import Message, ToolCall
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import ScriptedModel, call
from serving import serving
from test_webui import opened, shot


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


FAILED_REASON = "expected add with {'a': 2, 'b': 3}, got 0; the run made: add(a=1, b=1)"


def transcript(a: int, b: int, answer: str) -> list[dict[str, object]]:
    """A run's messages as the runner stores them: the prompt, a call of `add`, its result, the answer."""
    asked = Message.user(f"What is {a}+{b}?")
    called = Message.assistant(tool_calls=[ToolCall(id="call_1", name="add", arguments={"a": a, "b": b},
                                                    raw_arguments=json.dumps({"a": a, "b": b}))])
    result = Message.tool("call_1", "add", str(a + b))
    return [m.model_dump() for m in (asked, called, result, Message.assistant(answer))]


def sample_report(agent: str = "adder", dataset: str = "arithmetic", started_at: str = "2026-03-01T10:00:00.000Z",
                  model: str = "test:scripted") -> Report:
    """Two cases: `sum` passes, `wrong-args` fails its `ToolCalled` (its run called add(1, 1))."""
    usage = {"in_tokens": 120, "out_tokens": 30, "cost_usd": 0.0015}
    passing = CaseRun(run_id="r_1", output="5", duration_s=0.25, usage=usage, events=9,
                      results=[Result(name="NoError", evaluator="NoError", value=True),
                               Result(name="ToolCalled(add)", evaluator="ToolCalled", value=True)],
                      messages=transcript(2, 3, "The sum is 5."))
    failing = CaseRun(run_id="r_2", output="2", duration_s=0.5, usage=usage, events=9,
                      results=[Result(name="NoError", evaluator="NoError", value=True),
                               Result(name="ToolCalled(add)", evaluator="ToolCalled", value=False,
                                      reason=FAILED_REASON)],
                      messages=transcript(1, 1, "The sum is 2."))
    return Report(dataset=dataset, path=f"{dataset}.yaml", agent=agent, model=model, started_at=started_at,
                  duration_s=0.8, cases=[CaseReport(name="sum", inputs="What is 2+3?", runs=[passing]),
                                         CaseReport(name="wrong-args", inputs="What is 2+3?", runs=[failing])])


def write_reports(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    sample_report(started_at="2026-03-01T10:00:00.000Z").write_json(folder / "older.json")
    sample_report(dataset="weather", started_at="2026-03-02T09:00:00.000Z", model=None).write_json(  # type: ignore[arg-type]
        folder / "newer.json")
    sample_report(agent="other", dataset="secret").write_json(folder / "other-agent.json")
    (folder / "notes.json").write_text('{"todo": ["not a report"]}')
    (folder / "broken.json").write_text("{not json")
    (folder / "dataset.yaml").write_text("cases:\n  - inputs: hi\n")
    (folder.parent / "outside.json").write_text(sample_report().to_json())


@dataclass
class Live:
    url: str
    store: Store
    evals_dir: Path
    admin: str
    model: ScriptedModel


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[Live]:
    evals_dir = tmp_path / "evals"
    write_reports(evals_dir)
    model = ScriptedModel([call("add", a=2, b=3, id="call_7"), "The sum is 5."])
    agents = [Agent(model, name="adder", tools=[add]), Agent(ScriptedModel([]), name="other")]
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}")
    try:
        admin, _ = await store.keys.create("admin", scopes=["chat", "approve", "trigger", "admin"])
        app = create_app(ServerSettings(evals_dir=evals_dir, rate_limit_per_minute=0), store=store, agents=agents)
        async with serving(app) as url:
            yield Live(url, store, evals_dir, admin, model)
    finally:
        await store.close()


def client(live: Live, key: str | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=live.url, headers={"Authorization": f"Bearer {key or live.admin}"}, timeout=30)


async def conversation_with_a_tool_call(live: Live, key: str | None = None, realm: str | None = None) -> str:
    """A conversation of `adder` whose one turn ran through the server: add(2, 3), then the answer."""
    async with client(live, key) as c:
        body = {"agent": "adder", **({"realm": realm} if realm else {})}
        cid = (await c.post("/api/v1/chat/conversations", json=body)).json()["id"]
        sent = await c.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "What is 2+3?"},
                            headers={"Accept": "application/json"})
        assert sent.status_code == 200, sent.text
        assert (sent.json()["status"], sent.json()["message"]["content"]) == ("completed", "The sum is 5.")
    return cid


# -- reports -----------------------------------------------------------------------------------------------


async def test_reports_are_listed_newest_first_and_what_is_not_a_report_is_left_out(live: Live) -> None:
    async with client(live) as c:
        listed = await c.get("/api/v1/evals")
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert (body["configured"], body["hint"]) == (True, None)
    assert [e["name"] for e in body["data"]] == ["newer.json", "other-agent.json", "older.json"]
    newer = body["data"][0]
    assert {k: newer[k] for k in ("dataset", "agent", "model", "started_at")} == {
        "dataset": "weather", "agent": "adder", "model": None, "started_at": "2026-03-02T09:00:00.000Z"}
    summary = newer["summary"]
    assert (summary["cases"], summary["passed"], summary["failed"], summary["pass_rate"]) == (2, 1, 1, 0.5)
    assert summary["cost_usd"] == pytest.approx(0.003)
    assert newer["modified_at"].endswith("Z")


async def test_a_report_is_read_in_full_with_its_derived_fields(live: Live) -> None:
    async with client(live) as c:
        response = await c.get("/api/v1/evals/older.json")
    assert response.status_code == 200, response.text
    report = response.json()
    assert (report["name"], report["dataset"], report["agent"]) == ("older.json", "arithmetic", "adder")
    assert report["summary"]["pass_rate"] == 0.5
    passing, failing = report["cases"]
    assert (passing["name"], passing["passed"], passing["pass_rate"]) == ("sum", True, 1.0)
    assert (failing["name"], failing["passed"], failing["pass_rate"]) == ("wrong-args", False, 0.0)
    [run] = failing["runs"]
    assert run["passed"] is False
    assert [(r["name"], r["value"], r["reason"]) for r in run["results"] if r["value"] is False] == [
        ("ToolCalled(add)", False, FAILED_REASON)]
    assert [m["role"] for m in run["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert run["messages"][1]["tool_calls"][0]["arguments"] == {"a": 1, "b": 1}
    assert Report.model_validate(report).cases[1].runs[0].results[1].reason == FAILED_REASON


async def test_a_report_name_cannot_leave_the_folder(live: Live) -> None:
    async with client(live) as c:
        for name in ("..%2Foutside.json", "%2E%2E", "..json", ".hidden.json", "notes.json", "broken.json",
                     "dataset.yaml", "missing.json", "older", "%2Fetc%2Fpasswd"):
            response = await c.get(f"/api/v1/evals/{name}")
            assert response.status_code == 404, (name, response.text)
            assert response.json()["error"]["code"] in ("report_not_found", "not_found"), name
        assert (await c.get("/api/v1/evals/older.json")).status_code == 200
    (live.evals_dir / "link.json").symlink_to(live.evals_dir.parent / "outside.json")
    async with client(live) as c:
        assert (await c.get("/api/v1/evals/link.json")).status_code == 404
        assert "link.json" not in [e["name"] for e in (await c.get("/api/v1/evals")).json()["data"]]


async def test_reading_reports_takes_the_admin_scope_and_the_agent(live: Live) -> None:
    chat, _ = await live.store.keys.create("chat", scopes=["chat", "approve", "trigger"])
    adder_admin, _ = await live.store.keys.create("adder-admin", scopes=["admin"], agents=["adder"])
    async with client(live, chat) as c:
        for path in ("/api/v1/evals", "/api/v1/evals/older.json"):
            refused = await c.get(path)
            assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
    async with client(live, adder_admin) as c:
        assert [e["agent"] for e in (await c.get("/api/v1/evals")).json()["data"]] == ["adder", "adder"]
        hidden = await c.get("/api/v1/evals/other-agent.json")
        assert (hidden.status_code, hidden.json()["error"]["code"]) == (404, "report_not_found")
    async with httpx.AsyncClient(base_url=live.url) as c:
        assert (await c.get("/api/v1/evals")).status_code == 401


async def test_without_an_evals_dir_the_list_is_empty_with_a_hint(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}")
    try:
        app = create_app(ServerSettings(auth_mode="none"), store=store, agents=[Agent(ScriptedModel([]), name="a")])
        async with serving(app) as url, httpx.AsyncClient(base_url=url) as c:
            listed = (await c.get("/api/v1/evals")).json()
            assert (listed["data"], listed["configured"]) == ([], False)
            assert "RINGLET_EVALS_DIR" in listed["hint"]
            missing = await c.get("/api/v1/evals/older.json")
            assert missing.status_code == 404
            assert "RINGLET_EVALS_DIR" in missing.json()["error"]["message"]
            cid = (await store.conversations.create(agent="a")).id
            refused = await c.post(f"/api/v1/chat/conversations/{cid}/eval-case", json={"dataset": "d.yaml"})
            assert (refused.status_code, refused.json()["error"]["code"]) == (409, "evals_dir_not_set")
    finally:
        await store.close()


def test_evals_dir_is_a_setting_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RINGLET_EVALS_DIR", str(tmp_path))
    assert ServerSettings.from_env().evals_dir == tmp_path
    assert ServerSettings.from_env(evals_dir=tmp_path / "flag").evals_dir == tmp_path / "flag"


# -- capture -----------------------------------------------------------------------------------------------


async def test_a_conversation_becomes_a_case_with_its_tool_call(live: Live) -> None:
    cid = await conversation_with_a_tool_call(live)
    async with client(live) as c:
        shown = await c.post(f"/api/v1/chat/conversations/{cid}/eval-case", json={})
        assert shown.status_code == 200, shown.text
        assert shown.json()["dataset"] is None
        assert not list(live.evals_dir.glob("*.yml"))
        written = await c.post(f"/api/v1/chat/conversations/{cid}/eval-case",
                               json={"name": "adds", "dataset": "captured.yml"})
        again = await c.post(f"/api/v1/chat/conversations/{cid}/eval-case",
                             json={"name": "adds", "dataset": "captured.yml"})
    assert written.status_code == 200, written.text
    case = written.json()["case"]
    assert case == {"name": "adds", "inputs": "What is 2+3?",
                    "metadata": {"captured_output": "The sum is 5.", "conversation_id": cid, "agent": "adder"},
                    "evaluators": ["NoError", {"ToolCalled": {"name": "add", "args": {"a": 2, "b": 3}}}]}
    assert (written.json()["dataset"], written.json()["cases"]) == ("captured.yml", 1)
    assert (again.json()["case"]["name"], again.json()["cases"]) == ("adds-2", 2)  # a name already there
    dataset = Dataset.from_file(live.evals_dir / "captured.yml")
    assert [c.name for c in dataset.cases] == ["adds", "adds-2"]
    assert dataset.cases[0].evaluators == [NoError(), ToolCalled(name="add", args={"a": 2, "b": 3})]
    assert dataset.cases[0].prompt == "What is 2+3?"
    live.model.assert_complete()


async def test_a_case_named_by_default_after_the_conversation(live: Live) -> None:
    cid = await conversation_with_a_tool_call(live)
    async with client(live) as c:
        captured = await c.post(f"/api/v1/chat/conversations/{cid}/eval-case")
    assert captured.status_code == 200, captured.text
    assert captured.json()["case"]["name"] == "what-is-2-3"  # the title: the first user message


async def test_capture_sees_only_what_the_key_may_see(live: Live) -> None:
    cid = await conversation_with_a_tool_call(live)
    blue, _ = await live.store.keys.create("blue", scopes=["chat", "admin"], realms=["blue"])
    other, _ = await live.store.keys.create("other", scopes=["chat", "admin"], agents=["other"])
    for key in (blue, other):
        async with client(live, key) as c:
            hidden = await c.post(f"/api/v1/chat/conversations/{cid}/eval-case", json={"dataset": "x.yaml"})
            unknown = await c.post("/api/v1/chat/conversations/c_unknown/eval-case", json={})
        assert (hidden.status_code, hidden.json()["error"]["code"]) == (404, "conversation_not_found")
        assert hidden.json()["error"]["message"] == unknown.json()["error"]["message"].replace("c_unknown", cid)
    assert not (live.evals_dir / "x.yaml").exists()


async def test_writing_a_case_takes_the_admin_scope(live: Live) -> None:
    cid = await conversation_with_a_tool_call(live)
    chat, _ = await live.store.keys.create("chat", scopes=["chat"])
    admin_only, _ = await live.store.keys.create("admin-only", scopes=["admin"])
    async with client(live, chat) as c:
        assert (await c.post(f"/api/v1/chat/conversations/{cid}/eval-case", json={})).status_code == 200
        refused = await c.post(f"/api/v1/chat/conversations/{cid}/eval-case", json={"dataset": "d.yaml"})
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
        assert "admin" in refused.json()["error"]["message"]
    async with client(live, admin_only) as c:  # capturing reads a conversation: the chat scope
        refused = await c.post(f"/api/v1/chat/conversations/{cid}/eval-case", json={})
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
    assert not (live.evals_dir / "d.yaml").exists()


async def test_capture_refuses_bad_names_and_empty_conversations(live: Live) -> None:
    cid = await conversation_with_a_tool_call(live)
    (live.evals_dir / "bad.yaml").write_text("cases: []\n")
    async with client(live) as c:
        for dataset in ("../escape.yaml", "sub/d.yaml", ".hidden.yaml", "d.txt", "d"):
            response = await c.post(f"/api/v1/chat/conversations/{cid}/eval-case", json={"dataset": dataset})
            assert (response.status_code, response.json()["error"]["code"]) == (422, "validation_error"), dataset
        extra = await c.post(f"/api/v1/chat/conversations/{cid}/eval-case", json={"case": "x"})
        assert extra.status_code == 422
        broken = await c.post(f"/api/v1/chat/conversations/{cid}/eval-case", json={"dataset": "bad.yaml"})
        assert (broken.status_code, broken.json()["error"]["code"]) == (409, "invalid_dataset")
        empty = (await c.post("/api/v1/chat/conversations", json={"agent": "adder"})).json()["id"]
        nothing = await c.post(f"/api/v1/chat/conversations/{empty}/eval-case", json={})
        assert (nothing.status_code, nothing.json()["error"]["code"]) == (409, "conversation_empty")
    assert not (live.evals_dir.parent / "escape.yaml").exists()
    assert (live.evals_dir / "bad.yaml").read_text() == "cases: []\n"


# -- the web UI's Evals page -------------------------------------------------------------------------------


@pytest.mark.slow
@IN_SESSION_LOOP
async def test_the_evals_page_shows_reports_failing_cases_and_a_runs_transcript(tmp_path: Path,
                                                                                browser: Browser) -> None:
    evals_dir = tmp_path / "evals"
    write_reports(evals_dir)
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}")
    agents = [Agent(ScriptedModel([]), name="adder"), Agent(ScriptedModel([]), name="other")]
    try:
        app = create_app(ServerSettings(auth_mode="none", evals_dir=evals_dir), store=store, agents=agents)
        async with serving(app) as url, opened(browser, url) as (page, _):
            await page.get_by_role("link", name="Evals").click()
            rows = page.locator(".eval-report")
            await expect(rows).to_have_count(3)
            newer = page.locator(".eval-report[data-name='newer.json']")
            await expect(rows.first).to_have_attribute("data-name", "newer.json")  # newest first
            await expect(newer.locator(".eval-link")).to_have_text("weather")
            await expect(newer.locator(".eval-rate-text")).to_have_text("50%")
            await expect(newer.locator(".eval-counts")).to_have_text("1 passed1 failed")
            await expect(newer).to_contain_text("$0.0030")
            await expect(page.locator("#composer")).to_be_hidden()
            await shot(page, "evals-01-reports")

            await page.locator(".eval-report[data-name='older.json'] .eval-link").click()
            await expect(page).to_have_url(re.compile(r"#/evals/older\.json$"))
            cases = page.locator(".eval-case")
            await expect(cases).to_have_count(2)
            await expect(cases.first).to_have_attribute("data-case", "wrong-args")  # the failing one first
            failing = cases.first
            await expect(failing.locator(".eval-failure")).to_have_text(f"ToolCalled(add): {FAILED_REASON}")
            await expect(failing.locator(".eval-run-head")).to_contain_text("500 ms")
            await expect(failing.locator(".eval-run-head")).to_contain_text("150 tokens")
            await expect(failing.locator(".tool-card")).to_have_count(0)  # one click away
            await failing.locator(".eval-transcript > summary").click()
            tool = failing.locator(".tool-card[data-tool=add]")
            await expect(tool).to_have_attribute("data-state", "ok")
            await expect(tool.locator(".tool-args")).to_have_text(json.dumps({"a": 1, "b": 1}, indent=2))
            await expect(tool.locator(".tool-output")).to_have_text("2")
            await expect(failing.locator(".msg-user")).to_have_text("What is 1+1?")
            await expect(failing.locator(".msg-assistant")).to_have_text("The sum is 2.")
            await expect(cases.nth(1).locator(".eval-failure")).to_have_count(0)
            await shot(page, "evals-02-report")

            await page.goto(f"{url}/#/evals/missing.json")
            await expect(page.locator(".evals-page .form-error")).to_contain_text("No report named “missing.json”")
        async with serving(app) as url, opened(browser, url, width=390, height=844) as (page, _):
            await expect(page.get_by_role("link", name="Evals")).to_have_count(1)  # the top bar's is hidden
            await page.get_by_role("button", name="Conversations").click()
            await page.get_by_role("link", name="Evals").click()  # in the drawer
            await expect(page.locator("#sidebar")).not_to_be_in_viewport()
            await expect(page.locator(".eval-report")).to_have_count(3)
            await page.locator(".eval-report[data-name='older.json'] .eval-link").click()
            await page.locator(".eval-case[data-case=wrong-args] .eval-transcript > summary").click()
            await expect(page.locator(".eval-case[data-case=wrong-args] .tool-card[data-tool=add]")).to_be_visible()
            assert await page.evaluate("document.documentElement.scrollWidth") <= 390
            await shot(page, "evals-03-phone")
    finally:
        await store.close()
