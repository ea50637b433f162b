"""The web UI (issue #10) end to end: a real server on loopback, Debian's Chromium driven by Playwright, and
agents on test models. The UI talks only to the public API, so these tests also exercise the contract as a
browser client sees it.

Screenshots of the main screens are kept under tests/artifacts/webui/.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from playwright.async_api import Browser, Page, expect
from pydantic import BaseModel

from browser import IN_SESSION_LOOP
from ringlet import Agent, Gates, Limits, RunContext, SubAgents, tool
from ringlet.gates import ApprovalRules
from ringlet.models.base import Finish, ModelRequest
from ringlet.models.pricing import Price, Pricing
from ringlet.server import ServerSettings, create_app
from ringlet.server.catalog import Catalog, Hosted, HostedGraph
from ringlet.store import Store
from ringlet.testing import FunctionModel, call
from ringlet.tools.builtin.question import ask_question_tool
from ringlet.usage import RequestUsage
from serving import serving
from test_graph_support import make_graph

pytestmark = [pytest.mark.slow, IN_SESSION_LOOP]

ARTIFACTS = Path(__file__).parent / "artifacts" / "webui"
UI_DIR = Path(__file__).parents[1] / "src" / "ringlet" / "server" / "webui" / "ui"
expect.set_options(timeout=15_000)

# -- the agents -------------------------------------------------------------------------------------------


class Tap:
    """A model whose answer streams exactly the chunks the test puts in, when it puts them."""

    def __init__(self) -> None:
        self.chunks: asyncio.Queue[str | None] = asyncio.Queue()
        self.started = asyncio.Event()

    def put(self, text: str) -> None:
        self.chunks.put_nowait(text)

    def end(self) -> None:
        self.chunks.put_nowait(None)

    async def stream(self, request: ModelRequest) -> AsyncIterator[str]:
        self.started.set()
        while (chunk := await self.chunks.get()) is not None:
            yield chunk


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
def fetch_page(url: str) -> str:
    """Fetch a page (returns hostile markup)."""
    return f'<img src=y onerror="window.__pwned=4"><script>window.__pwned=5</script> from {url}'


@tool(effect="write")
def deploy(service: str) -> str:
    """Deploy a service."""
    return f"deployed {service}"


@tool(effect="write")
def ship(ctx: RunContext, parcel: str) -> str:
    """Ship a parcel."""
    ctx.notify("warning", "Slow courier", f"{parcel} may arrive late")
    return f"shipped {parcel}"


ANSWER = "The sum is **5**.\n\n```python\ndef add(a, b):\n    return a + b  # adds\n```\n\n- one\n- two"
HOSTILE = ('Look: <img src=x onerror="alert(document.domain)"> and <script>window.__pwned=2</script> '
           "and [click me](javascript:window.__pwned=3) and <b>not bold</b> **bold**")


def adding(request: ModelRequest) -> Any:
    return ANSWER if request.messages[-1].role == "tool" else call("add", a=2, b=3)


async def caching(request: ModelRequest) -> Any:
    """Answers as a provider with a prompt cache reports it: most of the prompt read from the cache."""
    yield "Cached."
    yield Finish("stop", RequestUsage(provider="test", model="cacher", in_tokens=1200, out_tokens=3,
                                      cache_read_tokens=1000))


def hostile(request: ModelRequest) -> Any:
    return HOSTILE if request.messages[-1].role == "tool" else call("fetch_page", url="http://example.test/")


def deploying(request: ModelRequest) -> Any:
    results = [m for m in request.messages if m.role == "tool"]
    if results:
        return " | ".join(m.content for m in results)
    return [call("deploy", service=s, id=f"c_{s}") for s in request.messages[-1].text.split()]


def asking(request: ModelRequest) -> Any:
    """Asks which colours (multi-select); "pick" asks for one size, "describe" for text."""
    last = request.messages[-1]
    if last.role == "tool":
        return f"you said {last.content}"
    if last.text == "pick":
        return call("ask_question", {"question": "Which size?", "input_type": "single-select", "options": [
            {"label": "S"}, {"label": "M", "description": "medium"}, {"label": "L"}], "allow_freeform": False})
    if last.text == "describe":
        return call("ask_question", {"question": "Describe the colour", "input_type": "text"})
    return call("ask_question", {"question": "Which colours?", "input_type": "multi-select", "options": [
        {"label": "red"}, {"label": "green", "description": "like grass"}, {"label": "blue"}]}, id="q1")


def courier(request: ModelRequest) -> Any:
    return "the parcel is on its way" if request.messages[-1].role == "tool" else call("ship", parcel="books")


def leading(request: ModelRequest) -> Any:
    results = [m for m in request.messages if m.role == "tool"]
    if results:
        return f"child said: {results[-1].content}"
    return call("spawn_agent", {"task": "ship the books", "agent": "courier"}, id="s1")


DRAFTER = """
name: drafter
description: Drafts a note, then stamps it with where its script ran.
start: draft
nodes:
  draft: {type: llm, prompt: "Draft: {{initial_prompt}}", state_updates: {note: "{{output}}"}, next: stamp}
  stamp: {type: script, script: scripts/stamp.py, next: done}
  done: {type: end, output: "{{note}} ({{where}})"}
"""
STAMP = "import json, os\nprint(json.dumps({'where': os.path.basename(os.getcwd())}))\n"


@dataclass
class Ui:
    url: str
    store: Store
    app: Any
    tap: Tap
    drafts: Tap
    """The model of the graph agent's llm node."""
    api: httpx.AsyncClient = field(init=False)


def catalog(tap: Tap, drafts: Tap, agents: Path) -> Catalog:
    courier_agent = Agent(FunctionModel(courier), name="courier", tools=[ship])

    def hosted(agent: Agent, description: str, starters: list[str] | None = None) -> Hosted:
        return Hosted(agent.name, "loop", description, starters or [], _agent=agent)

    return Catalog([
        hosted(Agent(FunctionModel(tap.stream, name="test:writer"), name="writer",  # priced: its cost shows
                     limits=Limits(pricing=Pricing({"test:writer": Price(1.0, 2.0)}))),
               "Writes when told to.", ["Tell me a story"]),
        hosted(Agent(FunctionModel(adding, context_window=8000), name="adder", tools=[add],
                     instructions="Add numbers."), "Adds numbers with a tool.", ["Add 2 and 3"]),
        hosted(Agent(FunctionModel(hostile), name="hostile", tools=[fetch_page]), "Answers with markup."),
        hosted(Agent(FunctionModel(caching), name="cacher"), "Reads most of its prompt from a cache."),
        hosted(Agent(FunctionModel(deploying), name="ops", tools=[deploy], gates=Gates(approvals=ApprovalRules(
            {"deploy": {"mode": "confirm", "timeout_s": 600}}))), "Deploys after a human says yes."),
        hosted(Agent(FunctionModel(asking), name="painter", tools=[ask_question_tool()]), "Asks which colours."),
        hosted(Agent(FunctionModel(leading), name="lead", tools=[SubAgents([courier_agent])]),
               "Delegates to a courier."),
        hosted(courier_agent, "Ships parcels."),
        HostedGraph.at(make_graph(agents, DRAFTER, name="drafter", files={"scripts/stamp.py": STAMP}),
                       model=FunctionModel(drafts.stream)),
    ])


@contextlib.asynccontextmanager
async def ui_server(tmp: Path, *, auth_mode: Literal["key", "none"] = "none") -> AsyncIterator[Ui]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp / 'ringlet.db'}")
    tap, drafts = Tap(), Tap()
    app = create_app(ServerSettings(auth_mode=auth_mode, ping_interval_s=1.0), store=store,
                     agents=catalog(tap, drafts, tmp / "agents"))
    try:
        async with serving(app) as url:
            ui = Ui(url, store, app, tap, drafts)
            async with httpx.AsyncClient(base_url=url, timeout=30) as api:
                ui.api = api
                yield ui
            tap.end()  # a run still streaming ends, so the server stops at once
            drafts.end()
    finally:
        await store.close()


# -- the browser ------------------------------------------------------------------------------------------


@dataclass
class Watch:
    """What a page did that a test must not miss: dialogs it opened, script errors, requests it made."""

    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    resumed_from: list[str | None] = field(default_factory=list)
    """The `Last-Event-ID` of each request for a conversation's event stream."""


@contextlib.asynccontextmanager
async def opened(browser: Browser, url: str, *, width: int = 1360, height: int = 900,
                 path: str = "/") -> AsyncIterator[tuple[Page, Watch]]:
    context = await browser.new_context(viewport={"width": width, "height": height})
    page = await context.new_page()
    watch = Watch()

    async def on_dialog(dialog: Any) -> None:
        watch.dialogs.append(dialog.message)
        await dialog.dismiss()

    page.on("dialog", on_dialog)
    page.on("pageerror", lambda exc: watch.errors.append(str(exc)))

    def on_request(request: Any) -> None:
        watch.requests.append(request.url)
        if request.url.endswith("/events"):
            watch.resumed_from.append(request.headers.get("last-event-id"))

    page.on("request", on_request)
    await page.goto(url + path)
    try:
        yield page, watch
        assert watch.errors == []
        assert watch.dialogs == []
    finally:
        await context.close()


DOCS_IMAGES = {
    "03-tool-card-and-context": "chat-tool-card-and-context",
    "05-approvals-inline": "approvals-inline",
    "06-approvals-list": "approvals-page",
    "forks-01-edited": "fork-edited",
    "checkpoints-01-editor": "checkpoints-editor",
    "evals-02-report": "evals-report",
}
"""Screenshots the docs show (docs/images/<name>.png): taken here, from a real server, on every run."""


async def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path))
    print(f"screenshot: {path}")
    if name in DOCS_IMAGES:
        docs = Path(__file__).parents[1] / "docs" / "images" / f"{DOCS_IMAGES[name]}.png"
        docs.parent.mkdir(exist_ok=True)
        docs.write_bytes(path.read_bytes())


async def choose(page: Page, agent: str) -> None:
    """On the home page: pick an agent (a new conversation starts with the first message)."""
    await page.locator(f".agent-card[data-agent={agent}] .choose").click()
    await expect(page.locator("#composer-input")).to_have_attribute("placeholder", re.compile(agent))


async def say(page: Page, text: str) -> None:
    await page.locator("#composer-input").fill(text)
    await page.locator("#composer-input").press("Enter")


def card(page: Page, tool: str) -> Any:
    return page.locator(f".tool-card[data-tool={tool}]")


# -- the tests --------------------------------------------------------------------------------------------


async def test_sign_in_with_a_key_then_an_answer_streams_token_by_token(tmp_path: Path, browser: Browser) -> None:
    async with ui_server(tmp_path, auth_mode="key") as ui:
        key, _ = await ui.store.keys.create("ana", scopes=["chat", "approve"], user_id="ana")
        async with opened(browser, ui.url) as (page, _):
            await expect(page.locator("#signin")).to_be_visible()
            await shot(page, "01-sign-in")
            await page.locator("#signin-key").fill("rk_not_a_key")
            await page.locator("#signin-key").press("Enter")
            await expect(page.locator("#signin-error")).to_have_text("That API key was not accepted.")
            await page.locator("#signin-key").fill(key)
            await page.get_by_role("button", name="Sign in").click()
            writer = page.locator(".agent-card[data-agent=writer]")
            await expect(writer.locator(".agent-desc")).to_have_text("Writes when told to.")
            await expect(page.locator(".agent-card[data-agent=adder] .starter")).to_have_text(["Add 2 and 3"])
            assert await page.evaluate("sessionStorage.getItem('ringlet.api_key')") == key
            await shot(page, "02-agents")

            await writer.get_by_role("button", name="Tell me a story").click()
            answer = page.locator(".msg-assistant")
            ui.tap.put("Once")
            await expect(answer).to_have_text("Once")  # a partial answer, shown as it streams
            await expect(page.locator("#stop")).to_be_visible()
            await expect(page.locator("#send")).to_be_disabled()
            ui.tap.put(" upon")
            await expect(answer).to_have_text("Once upon")
            ui.tap.put(" a time.")
            ui.tap.end()
            await expect(page.locator(".run-usage")).to_be_visible()
            await expect(answer).to_have_text("Once upon a time.")
            await expect(page.locator("#stop")).to_be_hidden()
            await expect(page.locator(".msg-user")).to_have_text(["Tell me a story"])
            await expect(page.locator(".conv-item .conv-title")).to_have_text(["Tell me a story"])
            await expect(page.locator(".conn")).to_have_attribute("data-state", "live")  # streams took the key

            await page.get_by_role("button", name="Sign out").click()
            await expect(page.locator("#signin")).to_be_visible()
            assert await page.evaluate("sessionStorage.getItem('ringlet.api_key')") is None


async def test_auth_mode_none_goes_straight_in_and_everything_is_served_locally(tmp_path: Path,
                                                                                browser: Browser) -> None:
    async with ui_server(tmp_path) as ui:
        index = await ui.api.get("/")
        assert index.status_code == 200
        assert "script-src 'self'" in index.headers["content-security-policy"]
        assert (await ui.api.get("/ui/app.js")).headers["content-type"].startswith("text/javascript")
        for path in UI_DIR.iterdir():  # no CDN: nothing refers to another host
            text = path.read_text()
            assert not re.search(r"(?:src|href|url|import)\s*[=(]?\s*[\"']?(?:https?:)?//", text), path.name
        async with opened(browser, ui.url) as (page, watch):
            await expect(page.locator(".agent-card")).to_have_count(9)
            await expect(page.locator("#signin")).to_be_hidden()
            await expect(page.locator("#who")).to_have_text("local · no sign-in")
            await page.locator(".agent-card[data-agent=adder] .starter").click()
            await expect(card(page, "add")).to_have_attribute("data-state", "ok")
            await expect(page.locator(".run-usage")).to_be_visible()
            assert watch.requests
            assert all(url.startswith(ui.url + "/") for url in watch.requests), watch.requests


async def test_tool_card_markdown_and_the_context_pie_chart(tmp_path: Path, browser: Browser) -> None:
    async with ui_server(tmp_path) as ui, opened(browser, ui.url) as (page, _):
        await choose(page, "adder")
        await say(page, "Add 2 and 3")
        add_card = card(page, "add")
        await expect(add_card.locator(".tool-name")).to_have_text("add")
        await expect(add_card.locator(".tool-output")).to_have_text("5")
        await expect(add_card.locator(".tool-args")).to_have_text('{\n  "a": 2,\n  "b": 3\n}')
        await expect(add_card.locator(".policy")).to_have_text("policy: allow")
        await expect(add_card.locator(".tool-meta .chip").first).to_have_text(re.compile(r"^\d+ ms$"))
        answer = page.locator(".msg-assistant")
        await expect(answer.locator("strong")).to_have_text("5")
        await expect(answer.locator("pre code")).to_have_text("def add(a, b):\n    return a + b  # adds")
        await expect(answer.locator(".hl-kw")).to_have_text(["def", "return"])
        await expect(answer.locator(".hl-com")).to_have_text("# adds")
        await expect(answer.locator("li")).to_have_text(["one", "two"])
        await expect(page.locator(".run-usage")).to_be_visible()

        cid = (await ui.api.get("/api/v1/chat/conversations")).json()["data"][0]["id"]
        report = (await ui.api.get(f"/api/v1/chat/conversations/{cid}/context")).json()
        panel = page.locator("#context-body")
        await expect(panel.locator(".total")).to_have_attribute("data-total", str(report["total"]))
        await expect(panel.locator(".window")).to_have_attribute("data-window", "8000")
        assert report["context_window"] == 8000
        for key in ("system", "tool_definitions", "user", "assistant", "tool_results"):
            await expect(panel.locator(f".legend-row[data-key={key}]")).to_have_attribute(
                "data-tokens", str(report[key]))
            if report[key]:
                await expect(panel.locator(f"svg.pie .slice[data-key={key}]")).to_have_attribute(
                    "data-tokens", str(report[key]))
        await expect(panel.locator("svg.pie .threshold-warning")).to_have_count(1)
        await expect(panel.locator("svg.pie .threshold-danger")).to_have_count(1)
        await expect(panel.locator(".context-state")).to_have_attribute("data-level", "ok")
        usage = (await ui.api.get(f"/api/v1/chat/conversations/{cid}")).json()["conversation"]["usage"]
        await expect(panel.locator(".usage-in")).to_have_text(f"{usage['in_tokens']:,}")
        await expect(panel.locator(".usage-cost")).to_have_text("no price")
        await shot(page, "03-tool-card-and-context")


async def test_cached_input_shows_in_the_usage_line_and_the_context_panel(tmp_path: Path, browser: Browser) -> None:
    async with ui_server(tmp_path) as ui, opened(browser, ui.url) as (page, _):
        await choose(page, "cacher")
        await say(page, "Hello")
        await expect(page.locator(".run-usage")).to_have_text("1,200 in (1,000 cached) · 3 out")
        cached = page.locator("#context-body .cached")
        await expect(cached).to_have_attribute("data-cached", "1000")
        await expect(cached).to_contain_text("1,000 of the last request's 1,200 input tokens")


RING_GEOMETRY = """() => {
  const chart = document.querySelector("#context-body svg.pie");
  const [, , width, height] = chart.getAttribute("viewBox").split(" ").map(Number);
  const distances = (el) => {
    const length = el.getTotalLength();
    return Array.from({length: 241}, (_, i) => {
      const p = el.getPointAtLength((length * i) / 240);
      return Math.hypot(p.x - width / 2, p.y - height / 2);
    });
  };
  return {free: distances(chart.querySelector(".slice-free")), size: Math.min(width, height),
          others: [...chart.querySelectorAll("path, line")].filter((el) => !el.matches(".slice-free"))
            .map((el) => ({what: el.getAttribute("class"), distances: distances(el)}))};
}"""

COUNT_READS = """() => {  // counts each answer the page has finished acting on, by kind of request
  window.__acted = {context: 0, conversation: 0};
  const realFetch = window.fetch;
  window.fetch = async (...args) => {
    const response = await realFetch(...args);
    const url = String(args[0]);
    const kind = url.endsWith("/context") ? "context" : url.endsWith("?messages_limit=1") ? "conversation" : null;
    if (kind) {
      const json = response.json.bind(response);
      response.json = async () => {
        const data = await json();
        setTimeout(() => { window.__acted[kind] += 1; }, 0);  // after the code awaiting this has run
        return data;
      };
    }
    return response;
  };
}"""


async def test_the_context_donut_stays_on_its_ring_and_the_panel_follows_each_run(tmp_path: Path,
                                                                                   browser: Browser) -> None:
    """The panel shows the state after the run even when answers to reads sent during the run come back
    last (a busy server); the chart draws a ring, nothing from its centre or beyond its edge."""
    async with ui_server(tmp_path) as ui, opened(browser, ui.url) as (page, _):
        held: dict[str, tuple[Any, Any]] = {}
        release, both_held = asyncio.Event(), asyncio.Event()

        async def hold_once(route: Any, kind: str) -> None:
            response = await route.fetch()  # what the server says now, while the run is going
            if kind in held or (kind == "conversation" and (await response.json())["conversation"]["status"]
                                != "running"):
                await route.fulfill(response=response)
                return
            held[kind] = (route, response)
            if len(held) == 2:
                both_held.set()
            await release.wait()
            await route.fulfill(response=response)

        async def on_context(route: Any) -> None:
            await (hold_once(route, "context") if ui.tap.started.is_set() else route.continue_())

        await page.route(re.compile(r"/context$"), on_context)
        await page.route(re.compile(r"\?messages_limit=1$"), lambda route: hold_once(route, "conversation"))
        cid = (await ui.api.post("/api/v1/chat/conversations", json={"agent": "writer"})).json()["id"]
        await page.goto(f"{ui.url}/#/c/{cid}")
        await page.evaluate(COUNT_READS)
        panel = page.locator("#context-body")
        await expect(panel.locator(".usage-cost")).to_have_text("–")  # nothing used yet: no cost to show
        await say(page, "Tell me a story")
        async with asyncio.timeout(15):
            await ui.tap.started.wait()  # the run is going: read the context now
        await page.locator("#refresh-context").click()
        async with asyncio.timeout(15):
            await both_held.wait()
        await expect(panel.locator(".legend-row[data-key=assistant]")).to_have_attribute("data-tokens", "0")
        ui.tap.put("Once upon a time, a ring.")
        ui.tap.end()
        await expect(page.locator(".run-usage")).to_be_visible()

        report = (await ui.api.get(f"/api/v1/chat/conversations/{cid}/context")).json()
        usage = (await ui.api.get(f"/api/v1/chat/conversations/{cid}")).json()["conversation"]["usage"]
        assert report["assistant"] > 0
        assert usage["cost_usd"] is not None
        fresh = {"assistant": str(report["assistant"]), "total": str(report["total"]),
                 "in": f"{usage['in_tokens']:,}", "cost": f"${usage['cost_usd']:.4f}"}

        async def panel_shows_the_run() -> None:
            await expect(panel.locator(".legend-row[data-key=assistant]")).to_have_attribute(
                "data-tokens", fresh["assistant"])
            await expect(panel.locator(".total")).to_have_attribute("data-total", fresh["total"])
            await expect(panel.locator(".usage-in")).to_have_text(fresh["in"])
            await expect(panel.locator(".usage-cost")).to_have_text(fresh["cost"])

        await panel_shows_the_run()  # refreshed at the run's end, without a reload
        acted = await page.evaluate("({...window.__acted})")
        release.set()  # now the answers to the reads made during the run arrive, last
        await page.wait_for_function("([c, v]) => window.__acted.context > c && window.__acted.conversation > v",
                                     arg=[acted["context"], acted["conversation"]])
        await panel_shows_the_run()
        await page.locator("#refresh-context").click()  # drawn again from what the page now holds as current
        await page.wait_for_function("(c) => window.__acted.context > c", arg=acted["context"] + 1)
        await panel_shows_the_run()

        ring = await page.evaluate(RING_GEOMETRY)
        inner, outer = min(ring["free"]), max(ring["free"])
        assert 30 < inner < outer <= ring["size"] / 2  # a ring with a hole, inside the chart
        drawn = {item["what"] for item in ring["others"]}
        assert {"slice slice-user", "slice slice-assistant", "threshold threshold-warning",
                "threshold threshold-danger"} <= drawn
        for item in ring["others"]:
            off = [d for d in item["distances"] if not inner - 0.5 <= d <= outer + 0.5]
            assert off == [], f"{item['what']} leaves the ring (ring {inner:.1f}–{outer:.1f}): {off[:5]}"
        await shot(page, "04-context-after-a-run")


async def test_script_injection_in_model_and_tool_output_stays_text(tmp_path: Path, browser: Browser) -> None:
    async with ui_server(tmp_path) as ui, opened(browser, ui.url) as (page, watch):
        await choose(page, "hostile")
        await say(page, "<img src=z onerror=\"alert('user')\">")
        answer = page.locator(".msg-assistant")
        await expect(answer).to_contain_text("**bold**".strip("*"))
        await expect(page.locator(".run-usage")).to_be_visible()
        await expect(answer).to_contain_text('<img src=x onerror="alert(document.domain)">')
        await expect(answer).to_contain_text("<script>window.__pwned=2</script>")
        await expect(answer).to_contain_text("<b>not bold</b>")
        await expect(answer.locator("strong")).to_have_text("bold")
        await expect(answer.locator("a")).to_have_count(0)  # the javascript: link is text only
        await expect(answer).to_contain_text("click me")
        await expect(card(page, "fetch_page").locator(".tool-output")).to_contain_text(
            "<script>window.__pwned=5</script>")
        await expect(page.locator(".msg-user")).to_have_text("<img src=z onerror=\"alert('user')\">")
        transcript = page.locator(".transcript")
        await expect(transcript.locator("img")).to_have_count(0)
        await expect(transcript.locator("script")).to_have_count(0)
        await expect(transcript.locator("b")).to_have_count(0)
        assert await page.evaluate("window.__pwned") is None
        await page.reload()  # the stored transcript renders as inertly
        await expect(page.locator(".msg-assistant")).to_contain_text("<script>window.__pwned=2</script>")
        await expect(page.locator(".transcript img")).to_have_count(0)
        assert await page.evaluate("window.__pwned") is None
        assert watch.dialogs == []
        await shot(page, "04-injection-inert")


async def test_approve_one_call_and_deny_another_with_a_note(tmp_path: Path, browser: Browser) -> None:
    async with ui_server(tmp_path) as ui, opened(browser, ui.url) as (page, _):
        await choose(page, "ops")
        await say(page, "api web")
        api_card, web_card = card(page, "deploy").nth(0), card(page, "deploy").nth(1)
        await expect(api_card.locator(".approval .approval-reason")).to_have_text("deploy requires confirmation")
        await expect(web_card.locator(".approval")).to_have_attribute("data-status", "pending")
        await expect(api_card.locator(".approval-args")).to_have_text('{\n  "service": "api"\n}')
        await expect(api_card.locator(".effect")).to_have_text("write")
        await expect(api_card.locator(".expires")).to_have_text(re.compile(r"^expires in (9:5\d|10:00)$"))
        await expect(page.locator("#approvals-count")).to_have_text("2")
        await shot(page, "05-approvals-inline")
        await page.reload()  # the paused run's approvals come back from the stored transcript
        await expect(web_card.locator(".approval")).to_have_attribute("data-status", "pending")
        await expect(api_card.get_by_role("button", name="Allow")).to_be_visible()

        await page.locator("#approvals-link").click()  # every conversation's pending approvals
        listed = page.locator(".approval-list .approval")
        await expect(listed).to_have_count(2)
        await expect(listed.locator(".approval-conv").first).to_have_text("ops: api web")
        await shot(page, "06-approvals-list")
        await listed.locator(".approval-conv").first.click()

        await api_card.get_by_role("button", name="Allow").click()
        await web_card.get_by_placeholder("Note (optional)").fill("web is frozen")
        await web_card.get_by_role("button", name="Deny").click()
        await expect(api_card.locator(".tool-output")).to_have_text("deployed api")
        await expect(web_card.locator(".tool-error")).to_have_text(
            "approval_denied: denied by local: web is frozen")
        await expect(api_card.locator(".approval-outcome")).to_contain_text("Approved by local")
        await expect(web_card.locator(".approval-outcome")).to_contain_text("Denied by local")
        await expect(web_card.locator(".decision-note")).to_have_text("web is frozen")
        await expect(page.locator(".msg-assistant")).to_contain_text("deployed api |")
        await expect(page.locator("#approvals-count")).to_have_text("0")
        await expect(page.locator(".conv-item")).to_have_attribute("data-status", "idle")
        await shot(page, "07-approvals-decided")

        await page.reload()  # decided approvals show who decided after a reload too
        await expect(card(page, "deploy").nth(1).locator(".approval-outcome")).to_contain_text(
            "Denied by local")


async def test_a_multi_select_question_is_checked_then_answered(tmp_path: Path, browser: Browser) -> None:
    async with ui_server(tmp_path) as ui, opened(browser, ui.url) as (page, _):
        await choose(page, "painter")
        await say(page, "paint")
        question = page.locator(".question")
        await expect(question.locator(".question-text")).to_have_text("Which colours?")
        await expect(question.locator(".check")).to_have_count(3)
        await expect(question.locator(".option-desc")).to_have_text(["like grass"])
        await expect(page.locator(".composer")).to_have_attribute("data-status", "input_required")
        await question.get_by_role("button", name="Send answer").click()
        await expect(question.locator(".form-error")).to_have_text(re.compile("Choose at least one option"))
        await question.get_by_label("red").check()
        await question.get_by_label("blue").check()
        await question.get_by_placeholder("Or write your own answer").fill("teal")
        await question.get_by_role("button", name="Send answer").click()
        await expect(question.locator(".form-error")).to_have_text(re.compile("not both"))
        await question.get_by_placeholder("Or write your own answer").fill("")
        await shot(page, "08-question")
        await question.get_by_role("button", name="Send answer").click()
        await expect(question.locator(".question-outcome")).to_have_text("Answered: red, blue")
        await expect(page.locator(".msg-assistant")).to_contain_text('"answer": ["red", "blue"]')
        await expect(card(page, "ask_question")).to_have_attribute("data-state", "ok")


async def test_single_select_options_and_a_text_question(tmp_path: Path, browser: Browser) -> None:
    async with ui_server(tmp_path) as ui, opened(browser, ui.url) as (page, _):
        await choose(page, "painter")
        await say(page, "pick")
        question = page.locator(".question").last
        await expect(question.locator(".question-text")).to_have_text("Which size?")
        await expect(question.locator(".option .option-label")).to_have_text(["S", "M", "L"])
        await expect(question.get_by_role("button", name="Send answer")).to_have_count(0)  # a click answers
        await question.get_by_role("button", name=re.compile("^M")).click()
        await expect(question.locator(".question-outcome")).to_have_text("Answered: M")
        await expect(page.locator(".msg-assistant").last).to_contain_text('"answer": "M"')
        await expect(page.locator("#send")).to_be_enabled()

        await say(page, "describe")
        question = page.locator(".question").last
        await expect(question.locator(".question-text")).to_have_text("Describe the colour")
        await question.get_by_role("button", name="Send answer").click()
        await expect(question.locator(".form-error")).to_have_text("Write an answer first.")
        await question.get_by_role("textbox").fill("sea blue")
        await question.get_by_role("button", name="Send answer").click()
        await expect(question.locator(".question-outcome")).to_have_text("Answered: sea blue")
        await expect(page.locator(".msg-assistant").last).to_contain_text('"answer": "sea blue"')


async def test_a_reload_mid_stream_resumes_without_duplicated_text(tmp_path: Path, browser: Browser) -> None:
    async with ui_server(tmp_path) as ui, opened(browser, ui.url) as (page, _):
        await choose(page, "writer")
        await say(page, "go")
        ui.tap.put("alpha ")
        await expect(page.locator(".msg-assistant")).to_have_text("alpha ")
        await page.reload()
        await expect(page.locator(".msg-assistant")).to_have_text("alpha ")  # replayed from the event log
        await expect(page.locator(".conn")).to_have_attribute("data-state", "live")
        await expect(page.locator("#stop")).to_be_visible()
        ui.tap.put("beta ")
        await expect(page.locator(".msg-assistant")).to_have_text("alpha beta ")
        ui.tap.put("omega")
        ui.tap.end()
        await expect(page.locator(".run-usage")).to_be_visible()
        await expect(page.locator(".msg-assistant")).to_have_text(["alpha beta omega"])
        await expect(page.locator(".msg-user")).to_have_text(["go"])


class Proxy:
    """A TCP proxy on loopback between the browser and the server, to cut the network in the middle of a run."""

    def __init__(self, target: str) -> None:
        self.port = int(target.rsplit(":", 1)[1])
        self.blocked = False
        self.links: set[asyncio.StreamWriter] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> Proxy:
        self.server = await asyncio.start_server(self.link, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        assert self.server is not None
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.blocked:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.links |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        for task in (asyncio.create_task(pipe(reader, up_writer)), asyncio.create_task(pipe(up_reader, writer))):
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def cut(self) -> None:
        """Drop every connection and refuse new ones."""
        self.blocked = True
        for writer in self.links:
            writer.transport.abort()
        self.links.clear()


async def test_a_network_drop_mid_run_reconnects_with_last_event_id(tmp_path: Path, browser: Browser) -> None:
    async with ui_server(tmp_path) as ui, Proxy(ui.url) as proxy, opened(browser, proxy.url) as (page, watch):
        await choose(page, "writer")
        await say(page, "go")
        ui.tap.put("one ")
        await expect(page.locator(".msg-assistant")).to_have_text("one ")
        await expect(page.locator(".conn")).to_have_attribute("data-state", "live")
        proxy.cut()
        await expect(page.locator(".conn")).to_have_attribute("data-state", "reconnecting")
        ui.tap.put("two ")  # sent while the page is cut off: it must come back through the replay
        ui.tap.put("three")
        before = len(watch.resumed_from)
        proxy.blocked = False
        await expect(page.locator(".conn")).to_have_attribute("data-state", "live")
        await expect(page.locator(".msg-assistant")).to_have_text("one two three")
        ui.tap.end()
        await expect(page.locator(".run-usage")).to_be_visible()
        await expect(page.locator(".msg-assistant")).to_have_text(["one two three"])
        resumed = [mark for mark in watch.resumed_from[before:] if mark is not None]
        assert resumed, watch.resumed_from  # the stream came back from the last event the page had
        assert int(resumed[-1]) >= 3  # message_start, status, the first delta at least


async def test_conversations_are_listed_newest_first_reopened_and_deleted(tmp_path: Path, browser: Browser) -> None:
    async with ui_server(tmp_path) as ui:
        ids = []
        for text in ("Add 1 and 1", "Add 2 and 3"):
            cid = (await ui.api.post("/api/v1/chat/conversations", json={"agent": "adder"})).json()["id"]
            done = await ui.api.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": text},
                                     headers={"Accept": "application/json"})
            assert done.json()["status"] == "completed"
            ids.append(cid)
        async with opened(browser, ui.url) as (page, _):
            items = page.locator(".conv-item .conv-title")
            await expect(items).to_have_text(["Add 2 and 3", "Add 1 and 1"])
            await page.get_by_role("link", name=re.compile("Add 1 and 1")).click()
            await expect(page).to_have_url(re.compile(f"#/c/{ids[0]}$"))
            await expect(page.locator(".msg-user")).to_have_text(["Add 1 and 1"])
            await expect(card(page, "add").locator(".tool-output")).to_have_text("5")
            await expect(page.locator(".msg-assistant strong")).to_have_text("5")
            await expect(page.locator("#conv-title")).to_have_text("Add 1 and 1")
            await shot(page, "09-reopened")
            delete = page.get_by_role("button", name="Delete conversation Add 1 and 1")
            await delete.click()
            await expect(delete).to_have_text("Delete?")
            await delete.click()
            await expect(items).to_have_text(["Add 2 and 3"])
            await expect(page.locator(".home h1")).to_have_text("Start a conversation")
        assert (await ui.api.get(f"/api/v1/chat/conversations/{ids[0]}")).status_code == 404


async def test_sub_agent_activity_nests_under_its_call_with_notices(tmp_path: Path, browser: Browser) -> None:
    async with ui_server(tmp_path) as ui, opened(browser, ui.url) as (page, _):
        await choose(page, "lead")
        await say(page, "ship it")
        spawn = card(page, "spawn_agent")
        child = spawn.locator(".subagent[data-agent=courier]")
        await expect(child.locator(".tool-card[data-tool=ship] .tool-output")).to_have_text("shipped books")
        await expect(child.locator(".notice-warning .notice-title")).to_have_text("Slow courier")
        await expect(child.locator(".notice-warning .notice-message")).to_have_text("books may arrive late")
        await expect(child.locator(".msg-assistant")).to_have_text("the parcel is on its way")
        await expect(child.locator(".subagent-status")).to_have_text("done")
        await expect(page.locator(".run > .msg-assistant")).to_have_text("child said: the parcel is on its way")
        await expect(page.locator(".conv-item .conv-title")).to_have_text(["ship it"])
        await shot(page, "10-sub-agent")


WATCH_DONE = """() => {
  window.__done = [];
  new MutationObserver((changes) => {
    changes.forEach((c, i) => { // a record has the value before; the next one for its node, or now, the value after
      const el = c.target;
      const later = changes.slice(i + 1).find((d) => d.target === el);
      const now = later ? later.oldValue : el.dataset.state;
      if (el.matches(".run .gnode") && now === "done" && c.oldValue !== "done") window.__done.push(el.dataset.nodeId);
    });
  }).observe(document.body, {subtree: true, attributes: true, attributeOldValue: true,
    attributeFilter: ["data-state"]});
}"""


async def test_a_graph_agent_run_draws_its_diagram_and_colours_nodes_as_they_run(tmp_path: Path,
                                                                                  browser: Browser) -> None:
    async with ui_server(tmp_path) as ui, opened(browser, ui.url) as (page, _):
        await expect(page.locator(".agent-card[data-agent=drafter] .chip")).to_have_text("graph")
        await choose(page, "drafter")
        preview = page.locator(".agent-card[data-agent=drafter] .graph-diagram")  # the chosen graph, drawn
        await expect(preview.locator(".gnode .gtext")).to_have_text(["draft", "stamp", "done"])
        await page.evaluate(WATCH_DONE)
        await say(page, "release 2.0")

        diagram = page.locator(".run .graph-diagram")
        nodes = diagram.locator(".gnode[data-node-id]:not([data-node-id=''])")
        await expect(nodes).to_have_count(3)  # one per graph node, labelled, in layers under the start marker
        await expect(nodes.locator(".gtext")).to_have_text(["draft", "stamp", "done"])
        await expect(diagram.locator(".gnode[data-start]")).to_have_count(1)
        await expect(diagram.locator(".gedge")).to_have_count(3)
        node = {n: diagram.locator(f".gnode[data-node-id={n}]") for n in ("draft", "stamp", "done")}
        await expect(node["draft"]).to_have_attribute("data-state", "running")  # its model is still answering
        await expect(node["stamp"]).to_have_attribute("data-state", "pending")
        await expect(node["done"]).to_have_attribute("data-state", "pending")
        ys = [await node[n].evaluate("g => g.getBoundingClientRect().y") for n in ("draft", "stamp", "done")]
        assert ys[0] < ys[1] < ys[2], ys  # each node a layer below the one before it
        await shot(page, "13-graph-running")

        ui.drafts.put("Note about release 2.0")
        ui.drafts.end()
        for n in ("draft", "stamp", "done"):
            await expect(node[n]).to_have_attribute("data-state", "done")
        await expect(page.locator(".run > .msg-assistant").last).to_have_text("Note about release 2.0 (drafter)")
        await expect(page.locator(".graph-node[data-node-id=stamp] .node-info")).to_contain_text("→ done")
        assert await page.evaluate("window.__done") == ["draft", "stamp", "done"]  # they finished in order
        await expect(page.locator("#send")).to_be_enabled()
        await shot(page, "14-graph-done")


async def test_an_answer_cut_at_the_token_cap_says_so(tmp_path: Path, browser: Browser) -> None:
    from ringlet.testing import Reply

    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}")
    capped = Agent(FunctionModel(lambda request: Reply("The answer goes on and", finish_reason="length")),
                   name="capped")
    try:
        async with serving(create_app(ServerSettings(auth_mode="none"), store=store, agents=[capped])) as url, \
                opened(browser, url) as (page, _):
            await choose(page, "capped")
            await say(page, "go")
            await expect(page.locator(".msg-assistant")).to_have_text("The answer goes on and")
            await expect(page.locator(".run-end-length")).to_have_text("The answer was cut at the model's token limit.")
    finally:
        await store.close()


async def test_stop_cancels_the_run(tmp_path: Path, browser: Browser) -> None:
    async with ui_server(tmp_path) as ui, opened(browser, ui.url) as (page, _):
        await choose(page, "writer")
        await say(page, "go")
        ui.tap.put("partial")
        await expect(page.locator(".msg-assistant")).to_have_text("partial")
        await page.get_by_role("button", name="Stop").click()
        await expect(page.locator(".run-end-cancelled")).to_have_text("Stopped.")
        await expect(page.locator("#stop")).to_be_hidden()
        await expect(page.locator("#send")).to_be_enabled()
        cid = (await ui.api.get("/api/v1/chat/conversations")).json()["data"][0]["id"]
        assert (await ui.api.get(f"/api/v1/chat/conversations/{cid}")).json()["conversation"]["status"] == "idle"


async def test_phone_sized_screen_by_keyboard(tmp_path: Path, browser: Browser) -> None:
    async with ui_server(tmp_path) as ui, opened(browser, ui.url, width=390, height=844) as (page, _):
        await expect(page.locator("#sidebar")).not_to_be_in_viewport()
        choose_adder = page.locator(".agent-card[data-agent=adder] .choose")
        await choose_adder.focus()
        await page.keyboard.press("Enter")
        await expect(page.locator("#composer-input")).to_be_focused()
        await page.keyboard.type("Add 2 and 3")
        await page.keyboard.press("Enter")
        await expect(card(page, "add").locator(".tool-output")).to_have_text("5")
        await expect(page.locator(".run-usage")).to_be_visible()
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390
        await shot(page, "11-phone-conversation")
        await page.get_by_role("button", name="Conversations").click()
        await expect(page.locator("#sidebar")).to_be_in_viewport()
        await expect(page.locator(".conv-item .conv-title")).to_have_text(["Add 2 and 3"])
        await shot(page, "12-phone-drawer")
        await page.keyboard.press("Escape")
        await expect(page.locator("#sidebar")).not_to_be_in_viewport()
        await page.get_by_role("button", name="Context", exact=True).click()
        await expect(page.locator("#context svg.pie")).to_be_in_viewport()


MARKDOWN_PROBE = """async (inputs) => {
  const {renderMarkdown} = await import("/ui/markdown.js");
  const allowed = new Set(["P", "H1", "H2", "H3", "H4", "H5", "H6", "PRE", "CODE", "SPAN", "BLOCKQUOTE", "UL", "OL",
    "LI", "INPUT", "HR", "BR", "DIV", "TABLE", "THEAD", "TBODY", "TR", "TH", "TD", "A", "STRONG", "EM", "DEL"]);
  const attrs = new Set(["class", "href", "target", "rel", "start", "type", "disabled", "checked", "data-lang",
    "style"]);
  const problems = [];
  const shown = [];
  for (const text of inputs) {
    const box = document.createElement("div");
    box.append(renderMarkdown(text));
    for (const el of box.querySelectorAll("*")) {
      if (!allowed.has(el.tagName)) problems.push(`${el.tagName} from ${JSON.stringify(text)}`);
      for (const a of el.attributes) {
        if (!attrs.has(a.name)) problems.push(`${el.tagName}[${a.name}] from ${JSON.stringify(text)}`);
      }
      if (el.tagName === "A" && !/^(https?:|mailto:)/.test(el.href)) problems.push(`href ${el.href}`);
      if (el.getAttribute("style") && !/^text-align: (left|right|center);$/.test(el.getAttribute("style"))) {
        problems.push(`style ${el.getAttribute("style")}`);
      }
    }
    shown.push(box.innerHTML);
  }
  return {problems, shown, pwned: window.__pwned ?? null};
}"""

HOSTILE_FRAGMENTS = [
    "<script>window.__pwned=1</script>", '<img src=x onerror="window.__pwned=2">', "<svg onload=window.__pwned=3>",
    "[a](javascript:window.__pwned=4)", "[b](JaVaScRiPt:alert(1))", "[c](data:text/html,<script>alert(1)</script>)",
    "[d](vbscript:x)", "[e]( javascript:alert(1) )", "<javascript:alert(1)>", "![i](javascript:alert(1))",
    "![j](https://example.test/x.png)", '<a href="javascript:alert(1)">x</a>', "**<b>x</b>**", "`<i>code</i>`",
    "```html\n<script>alert(1)</script>\n```", "| <img src=x> | b |\n|---|---|\n| <script>x</script> | c |",
    "> <iframe src=x></iframe>", "- <style>*{}</style>\n  - nested <object>", "&lt;script&gt;", "\\<script>",
    "[x](https://ok.test/a_(b)) and https://ok.test/plain.", "*unclosed **bold _mixed ~~del", "# <h1>head</h1>",
    "1. one\n2. two\n   - [x] done\n   - [ ] todo", "***\n---\n___", "~~~\nfenced\n~~~", "\u0000\u202e reversed",
]


async def test_markdown_renderer_makes_only_safe_elements(tmp_path: Path, browser: Browser) -> None:
    async with ui_server(tmp_path) as ui, opened(browser, ui.url) as (page, _):
        await expect(page.locator(".agent-card").first).to_be_visible()
        combos = [*HOSTILE_FRAGMENTS, "\n\n".join(HOSTILE_FRAGMENTS), " ".join(HOSTILE_FRAGMENTS),
                  *(a + b for a in HOSTILE_FRAGMENTS[:12] for b in HOSTILE_FRAGMENTS[12:])]
        result = await page.evaluate(MARKDOWN_PROBE, combos)
        assert result["problems"] == []
        assert result["pwned"] is None
        shown = dict(zip(combos, result["shown"], strict=True))
        assert shown["<script>window.__pwned=1</script>"] == "<p>&lt;script&gt;window.__pwned=1&lt;/script&gt;</p>"
        assert shown["[a](javascript:window.__pwned=4)"] == "<p>a</p>"
        assert shown["![j](https://example.test/x.png)"] == (
            '<p><a href="https://example.test/x.png" target="_blank" rel="noopener noreferrer nofollow">🖼 j</a></p>')
        assert '<a href="https://ok.test/a_(b)"' in shown["[x](https://ok.test/a_(b)) and https://ok.test/plain."]
        assert 'href="https://ok.test/plain"' in shown["[x](https://ok.test/a_(b)) and https://ok.test/plain."]
        assert "<table>" in shown["| <img src=x> | b |\n|---|---|\n| <script>x</script> | c |"]
        assert shown["1. one\n2. two\n   - [x] done\n   - [ ] todo"].count('type="checkbox"') == 2
        assert shown["***\n---\n___"] == "<hr><hr><hr>"


DIAGRAM_PROBE = """async (text) => {
  const {GraphDiagram, parseMermaid} = await import("/ui/graphdiagram.js");
  const diagram = new GraphDiagram(text);
  Object.assign(diagram.el.style, {position: "fixed", inset: "0", zIndex: 99, background: "white"});
  document.body.append(diagram.el);
  diagram.setState("ask", "running");
  diagram.setState("nowhere", "done");
  const parsed = parseMermaid(text);
  const bad = [...diagram.el.querySelectorAll("*")].filter((el) => [...el.attributes].some(
    (a) => a.name.startsWith("on") || /NaN|undefined/.test(a.value)));
  return {
    nodes: [...diagram.el.querySelectorAll(".gnode[data-node-id]:not([data-start])")].map((g) => [
      g.dataset.nodeId, g.dataset.type, g.dataset.state, g.querySelector(".gtext").textContent]),
    edges: parsed.edges.map((e) => [parsed.nodes.get(e.from).nodeId, parsed.nodes.get(e.to).nodeId, e.label, e.style]),
    labels: [...diagram.el.querySelectorAll(".gedge > title")].map((t) => t.textContent),
    shown: [...diagram.el.querySelectorAll(".glabel")].map((t) => t.textContent),
    missing: diagram.el.querySelectorAll(".gnode-missing").length,
    bad: bad.map((el) => el.outerHTML), pwned: window.__pwned ?? null,
    images: diagram.el.querySelectorAll("img, script, foreignObject").length,
  };
}"""

EVERY_SHAPE = """flowchart TD
    __start__(("start")) --> n_ask
    n_ask{"ask (approval)"}
    n_plan("plan (llm)")
    n_go_on[/"go-on (agent)"/]
    n_run[["run (script)"]]
    n_kb[("kb (rag)")]
    n_each{{"each (map)"}}
    n_end(["end (end)"])
    n_plan --> n_run
    n_run --> n_kb
    n_kb --> n_plan
    n_each --> n_end
    n_ask -- "publish" --> n_end
    n_ask -- "<img src=x onerror=window.__pwned=1>" --> n_plan
    n_ask -- "other" --> n_each
    n_plan -. "fallback" .-> n_go_on
    n_each -. "each item" .-> n_go_on
    n_run --> n_ghost
    n_ghost:::missing
    classDef missing stroke:#d00,stroke-dasharray:4
"""


async def test_the_graph_diagram_draws_every_shape_cycles_and_labels_as_text(tmp_path: Path,
                                                                              browser: Browser) -> None:
    async with ui_server(tmp_path) as ui, opened(browser, ui.url) as (page, _):
        await expect(page.locator(".agent-card").first).to_be_visible()
        result = await page.evaluate(DIAGRAM_PROBE, EVERY_SHAPE)
        assert result["nodes"] == [
            ["ask", "approval", "running", "ask"], ["plan", "llm", "pending", "plan"],
            ["go-on", "agent", "pending", "go-on"], ["run", "script", "pending", "run"],
            ["kb", "rag", "pending", "kb"], ["each", "map", "pending", "each"], ["end", "end", "pending", "end"],
            ["ghost", "", "pending", "ghost"]]
        assert ["kb", "plan", "", "solid"] in result["edges"]  # the cycle back is drawn too
        assert ["plan", "go-on", "fallback", "dotted"] in result["edges"]
        assert len(result["edges"]) == 11
        assert "<img src=x onerror=window.__pwned=1>" in result["labels"]  # as text, shortened on the diagram
        assert result["shown"] == ["publish", "<img src=x onerror=wind…", "other", "fallback", "each item"]
        assert (result["missing"], result["bad"], result["pwned"], result["images"]) == (1, [], None, 0)
        await shot(page, "15-graph-shapes")


async def test_a_structured_answer_shows_as_formatted_json(tmp_path: Path, browser: Browser) -> None:
    class City(BaseModel):
        city: str
        rank: int

    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}")
    agent = Agent(FunctionModel(lambda request: call("final_result", city="Rome", rank=1)), name="typed",
                  output_type=City)
    try:
        async with serving(create_app(ServerSettings(auth_mode="none"), store=store, agents=[agent])) as url, \
                opened(browser, url) as (page, _):
            await choose(page, "typed")
            await say(page, "Which city?")
            code = page.locator(".msg-assistant pre code").last
            await expect(code).to_have_text('{\n  "city": "Rome",\n  "rank": 1\n}')
            await page.reload()  # from the stored transcript, the same
            await expect(page.locator(".msg-assistant pre code").last).to_have_text(
                '{\n  "city": "Rome",\n  "rank": 1\n}')
    finally:
        await store.close()
