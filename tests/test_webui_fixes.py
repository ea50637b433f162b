"""The web UI fixes of issue 42, each in Debian's Chromium: the conversation follows new approval and question
cards and the final answer (unless the reader scrolled up), the sidebar's status after a run ends, policy chips
and usage lines after a reload, a bare number such as "391." as text, and the context panel in the model's own
tokens. Screenshots go to tests/artifacts/webui/ with the others."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, expect

from browser import IN_SESSION_LOOP
from ringlet import Agent, Gates, tool
from ringlet.gates import ApprovalRules
from ringlet.models.base import ModelRequest
from ringlet.models.tokens import estimate_tools, prompt_tokens
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import FunctionModel, Reply, call
from ringlet.tools.builtin.question import ask_question_tool
from ringlet.usage import RequestUsage
from serving import serving
from test_webui import MARKDOWN_PROBE, Tap, card, choose, opened, say, shot

pytestmark = [pytest.mark.slow, IN_SESSION_LOOP]

LONG = "\n\n".join(f"Paragraph {i}: " + "words " * 30 for i in range(1, 31))


@tool(effect="read")
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return "391"


@tool(effect="write")
def deploy(service: str) -> str:
    """Deploy a service."""
    return f"deployed {service}"


def helper(request: ModelRequest) -> Any:
    """"long" answers with thirty paragraphs, "deploy" needs an approval, "ask" asks a question, anything
    else computes 17 * 23 with a tool and answers "391."."""
    last = request.messages[-1]
    if last.role == "tool":
        return "391." if last.name == "calculate" else f"{LONG}\n\nThe end: {last.content}"
    if last.text == "long":
        return f"{LONG}\n\nThe end."
    if last.text == "deploy":
        return call("deploy", service="api")
    if last.text == "ask":
        return call("ask_question", {"question": "Which size?", "input_type": "single-select",
                                     "options": [{"label": "S"}, {"label": "L"}]})
    return call("calculate", expression="17 * 23")


TEMPLATE_TOKENS = 1000
"""What a local model's prompt template adds to every request (its own tokenizer counts more, too)."""


def counted(request: ModelRequest) -> int:
    """The prompt tokens a model with its own tokenizer and template reports: far more than the estimate."""
    estimate = prompt_tokens(request.instructions, request.messages, estimate_tools(request.tools), {})
    return 3 * estimate + TEMPLATE_TOKENS


class Local:
    """A model that reports its own count of each prompt (`usage.estimated` false), as llama.cpp does."""

    def __init__(self) -> None:
        self.reported: list[int] = []

    def __call__(self, request: ModelRequest) -> Any:
        n = counted(request)
        self.reported.append(n)
        usage = RequestUsage(provider="test", model="local", in_tokens=n, out_tokens=3, estimated=False)
        if request.messages[-1].role == "tool":
            return Reply("391.", usage=usage)
        return Reply(calls=[call("calculate", expression="17 * 23")], usage=usage)


@contextlib.asynccontextmanager
async def server(tmp: Path, local: Local | None = None) -> AsyncIterator[tuple[str, httpx.AsyncClient, Tap]]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp / 'ringlet.db'}")
    tap = Tap()
    agents = [
        Agent(FunctionModel(helper), name="helper", tools=[calculate, deploy, ask_question_tool()],
              instructions="Answer briefly.", gates=Gates(approvals=ApprovalRules(
                  {"deploy": {"mode": "confirm", "timeout_s": 600}}))),
        Agent(FunctionModel(tap.stream), name="writer"),
        Agent(FunctionModel(local or Local(), context_window=8192), name="local", tools=[calculate],
              instructions="You are a helpful, concise assistant. Use a tool when it helps."),
    ]
    try:
        async with serving(create_app(ServerSettings(auth_mode="none", ping_interval_s=1.0), store=store,
                                      agents=agents)) as url, httpx.AsyncClient(base_url=url, timeout=30) as api:
            yield url, api, tap
            tap.end()
    finally:
        await store.close()


FULLY_IN_VIEW = """(selector) => {
  const el = [...document.querySelectorAll(selector)].at(-1);
  if (!el) return false;
  const view = document.querySelector("#view").getBoundingClientRect();
  const box = el.getBoundingClientRect();
  return box.height > 0 && box.top >= view.top - 1 && box.bottom <= view.bottom + 1;
}"""
"""Whether the last element matching the selector is wholly inside the scrolling view."""


async def test_the_view_follows_approval_and_question_cards_and_the_final_answer(tmp_path: Path,
                                                                                 browser: Browser) -> None:
    async with server(tmp_path) as (url, _, _), opened(browser, url, height=700) as (page, _):
        await choose(page, "helper")
        await say(page, "long")
        await expect(page.locator(".run-usage")).to_have_count(1)
        await page.wait_for_function(FULLY_IN_VIEW, arg=".run-usage")  # the end of the long answer

        await say(page, "deploy")  # the approval card appears below the message just sent
        approval = card(page, "deploy").locator(".approval[data-status=pending]")
        await expect(approval).to_be_visible()
        await expect(page.locator("#composer-input")).to_have_attribute("placeholder", re.compile("answer above"))
        await page.wait_for_function(FULLY_IN_VIEW, arg=".approval[data-status=pending]")
        await expect(page.locator("#context-body .total")).to_be_visible()
        await expect(page.locator("#context-body")).not_to_contain_text("null")  # no model count: the estimate
        await shot(page, "42-approval-in-view")
        await approval.get_by_role("button", name="Allow").click()
        await expect(page.locator(".msg-assistant").last).to_contain_text("The end: deployed api")
        await expect(page.locator(".run-usage")).to_have_count(2)
        await page.wait_for_function(FULLY_IN_VIEW, arg=".run-usage")  # the final answer's end
        await shot(page, "42-final-answer-in-view")

        await say(page, "ask")
        question = page.locator(".question[data-status=pending]")
        await expect(question).to_be_visible()
        await page.wait_for_function(FULLY_IN_VIEW, arg=".question[data-status=pending]")
        await shot(page, "42-question-in-view")
        await question.get_by_role("button", name="S", exact=True).click()
        await expect(page.locator(".run-usage")).to_have_count(3)
        await page.wait_for_function(FULLY_IN_VIEW, arg=".run-usage")


@pytest.mark.parametrize("how", ["wheel", "keys"])
async def test_a_reader_who_scrolled_up_stays_where_they_are(tmp_path: Path, browser: Browser, how: str) -> None:
    async with server(tmp_path) as (url, _, tap), opened(browser, url, height=700) as (page, _):
        await choose(page, "writer")
        await say(page, "go")
        tap.put(LONG)
        await expect(page.locator(".msg-assistant")).to_contain_text("Paragraph 30")
        await page.wait_for_function("""() => {  // following the answer down as it streams
          const v = document.querySelector("#view");
          return v.scrollHeight > 2 * v.clientHeight && v.scrollHeight - v.scrollTop - v.clientHeight < 40;
        }""")
        if how == "wheel":
            await page.locator("#view").hover()
            await page.mouse.wheel(0, -100_000)  # the reader goes back to the top, on purpose
        else:
            await page.locator(".msg-user").click()  # the view's text: its keys scroll the view
            await page.keyboard.press("Home")
        await page.wait_for_function("() => document.querySelector('#view').scrollTop === 0")
        tap.put("\n\nMore text after the reader scrolled up.")
        tap.end()
        await expect(page.locator(".run-usage")).to_be_visible()
        await expect(page.locator(".msg-assistant")).to_contain_text("More text after the reader scrolled up.")
        await page.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
        assert await page.evaluate("document.querySelector('#view').scrollTop") == 0
        await expect(page.locator(".msg-user")).to_be_in_viewport()


async def test_sidebar_status_is_idle_after_the_run_ends_elsewhere(tmp_path: Path, browser: Browser) -> None:
    async with server(tmp_path) as (url, _, tap), opened(browser, url) as (page, _):
        await choose(page, "writer")
        await say(page, "go")
        tap.put("partial ")
        await expect(page.locator(".msg-assistant")).to_have_text("partial ")
        item = page.locator(".conv-item")
        await expect(item).to_have_attribute("data-status", "running")
        await expect(item.locator(".chip")).to_have_text("running")
        await page.locator("#new-conv").click()  # the page leaves the conversation while its run goes on
        await expect(page.locator(".home h1")).to_have_text("Start a conversation")
        await page.reload()  # (or comes to the list afresh): the list it reads says running
        await expect(page.locator(".home h1")).to_have_text("Start a conversation")
        await expect(item).to_have_attribute("data-status", "running")
        tap.put("done")
        tap.end()
        await expect(item).to_have_attribute("data-status", "idle")
        await expect(item.locator(".chip")).to_have_count(0)
        await shot(page, "42-sidebar-idle")


async def test_policy_chips_and_usage_lines_come_back_after_a_reload(tmp_path: Path, browser: Browser) -> None:
    async with server(tmp_path) as (url, api, _), opened(browser, url) as (page, _):
        await choose(page, "helper")
        await say(page, "What is 17 * 23?")
        await expect(card(page, "calculate").locator(".policy")).to_have_text("policy: allow")
        usage = page.locator(".run-usage")
        await expect(usage).to_have_count(1)
        live = await usage.text_content()
        await say(page, "deploy")
        await card(page, "deploy").get_by_role("button", name="Deny").click()
        await expect(usage).to_have_count(2)
        chips = await page.locator(".tool-card .policy").all_text_contents()
        lines = await usage.all_text_contents()
        cid = (await api.get("/api/v1/chat/conversations")).json()["data"][0]["id"]
        runs = {m["run_id"] for m in (await api.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
                if m["run_id"]}
        totals = [(await api.get(f"/api/v1/runs/{r}")).json()["usage"] for r in runs]
        assert sorted(lines) == sorted(f"{u['in_tokens']:,} in · {u['out_tokens']:,} out" for u in totals)

        await page.reload()  # drawn from the stored transcript and the runs' records
        await expect(page.locator(".msg-user")).to_have_count(2)
        await expect(page.locator(".tool-card .policy")).to_have_text(chips)
        await expect(usage).to_have_text(lines)
        assert lines[0] == live
        await card(page, "calculate").scroll_into_view_if_needed()
        await shot(page, "42-reloaded-chips-and-usage")


async def test_a_bare_number_answer_shows_as_text(tmp_path: Path, browser: Browser) -> None:
    async with server(tmp_path) as (url, _, _), opened(browser, url) as (page, _):
        await choose(page, "helper")
        await say(page, "What is 17 * 23?")
        answer = page.locator(".msg-assistant")
        await expect(answer).to_have_text("391.")
        await expect(answer.locator("ol, li")).to_have_count(0)
        await expect(answer.locator("p")).to_have_text("391.")
        await shot(page, "42-bare-number")
        cases = ["391.", "2026.", "1.", "7)", "  42.  ", "2026.\nWas a good year.", "See:\n3.\nthat", "1. a\n2. b",
                 "- x\n\n391."]
        shown = dict(zip(cases, (await page.evaluate(MARKDOWN_PROBE, cases))["shown"], strict=True))
        assert shown["391."] == "<p>391.</p>"
        assert shown["2026."] == "<p>2026.</p>"
        assert shown["1."] == "<p>1.</p>"
        assert shown["7)"] == "<p>7)</p>"
        assert shown["  42.  "] == "<p>42.</p>"
        assert shown["2026.\nWas a good year."] == "<p>2026.<br>Was a good year.</p>"
        assert shown["See:\n3.\nthat"] == "<p>See:<br>3.<br>that</p>"
        assert shown["1. a\n2. b"] == "<ol><li>a</li><li>b</li></ol>"  # real lists stay lists
        assert shown["- x\n\n391."] == "<ul><li>x</li></ul><p>391.</p>"
        await page.reload()  # the stored answer, the same
        await expect(page.locator(".msg-assistant p")).to_have_text("391.")


async def test_the_context_panel_counts_in_the_models_own_tokens(tmp_path: Path, browser: Browser) -> None:
    local = Local()
    async with server(tmp_path, local) as (url, api, _), opened(browser, url) as (page, _):
        await choose(page, "local")
        await say(page, "What is 17 * 23?")
        await expect(page.locator(".run-usage")).to_be_visible()
        cid = (await api.get("/api/v1/chat/conversations")).json()["data"][0]["id"]
        report = (await api.get(f"/api/v1/chat/conversations/{cid}/context")).json()
        assert report["last_request"] == {"in_tokens": local.reported[-1], "estimated": report["last_request"][
            "estimated"], "cache_read_tokens": None}  # (it reports no prompt cache)
        panel = page.locator("#context-body")
        total = panel.locator(".total")
        await expect(panel.locator(".measured")).to_contain_text(f"it reported {local.reported[-1]:,} tokens")
        await expect(total).not_to_have_attribute("data-total", str(report["total"]))  # not the bare estimate
        shown = int(await total.get_attribute("data-total") or 0)  # read once the measured count is drawn
        await expect(panel.locator(".pie-percent")).to_have_text(f"{round(100 * shown / 8192)}%")
        await shot(page, "42-context-in-model-tokens")

        await say(page, "And 17 * 23 again?")  # what the model then counts for the next request
        await expect(page.locator(".run-usage")).to_have_count(2)
        sent = local.reported[2]  # the first request of the second run
        assert abs(shown - sent) <= 0.1 * sent, (shown, sent, report)
