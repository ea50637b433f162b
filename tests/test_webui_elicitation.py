"""An MCP server's elicitation in the web UI: `server-everything`'s `trigger-elicitation-request` asks for a
form while its tool call stays open; the browser shows it inline like any question, and what the human
types (or a click on Decline) reaches the MCP server, whose tool result the UI then shows."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Page, expect

from browser import IN_SESSION_LOOP
from ringlet import Agent
from ringlet.mcp.client import MCPToolset
from ringlet.mcp.config import MCPServerConfig
from ringlet.models.base import ModelRequest
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import FunctionModel, call
from serving import serving
from test_mcp_client import EVERYTHING
from test_webui import card, choose, opened, say

pytestmark = [pytest.mark.slow, IN_SESSION_LOOP]
expect.set_options(timeout=15_000)

TOOL = "trigger-elicitation-request"


def filling(request: ModelRequest) -> Any:
    """Calls the eliciting tool, then answers with the lines of its result that say what the server got."""
    last = request.messages[-1]
    if last.role != "tool":
        return call(TOOL, {}, id="e1")
    said = [line.removeprefix("- ").strip() for line in last.text.splitlines()
            if line.startswith("- ") or "declined" in line]
    return "The server received: " + "; ".join(said)


@dataclass
class Forms:
    url: str
    store: Store
    api: httpx.AsyncClient


@contextlib.asynccontextmanager
async def forms_ui(tmp: Path) -> AsyncIterator[Forms]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp / 'ringlet.db'}")
    everything = MCPToolset("everything", MCPServerConfig(command=str(EVERYTHING), args=["stdio"], timeout_s=120))
    agent = Agent(FunctionModel(filling), name="forms", tools=[everything])
    app = create_app(ServerSettings(auth_mode="none", ping_interval_s=1.0), store=store, agents=[agent])
    try:
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as api:
            yield Forms(url, store, api)
    finally:
        await everything.aclose()
        await store.close()


async def asked(page: Page) -> Any:
    """Start the run; wait for the elicitation to show inside the tool's card, as a question; return it."""
    await choose(page, "forms")
    await say(page, "fill the form")
    question = card(page, TOOL).locator(".question")
    await expect(question).to_be_visible()
    await expect(question.locator(".question-text")).to_contain_text("Please provide inputs for the following fields:")
    await expect(question.locator(".question-text")).to_contain_text("- name (string, required): Your full, legal name")
    shown = await question.locator(".question-text").inner_text()  # one field per line, as written
    assert "\n- name (string, required): Your full, legal name\n" in shown
    await expect(question.locator(".option .option-label")).to_have_text(["Decline"])
    await expect(question.locator(".option-desc")).to_have_text(["Do not give the server this information"])
    await expect(question.get_by_placeholder("Or write your own answer")).to_be_visible()
    await expect(card(page, TOOL)).to_have_attribute("data-state", "waiting")
    await expect(page.locator(".composer")).to_have_attribute("data-status", "input_required")
    return question


async def test_an_elicitation_answered_in_the_ui_reaches_the_mcp_server(tmp_path: Path, browser: Browser) -> None:
    async with forms_ui(tmp_path) as ui, opened(browser, ui.url) as (page, _):
        question = await asked(page)
        cid = (await ui.api.get("/api/v1/chat/conversations")).json()["data"][0]["id"]
        [pending] = (await ui.api.get(f"/api/v1/chat/conversations/{cid}")).json()["pending"]["questions"]
        assert pending["tool_call_id"] == "e1"

        answer = question.get_by_placeholder("Or write your own answer")
        await answer.fill('{"name": 5}')  # checked against the requested schema: refused, the form stays
        await question.get_by_role("button", name="Send answer").click()
        await expect(question.locator(".form-error")).to_contain_text("name: 5 is not of type 'string'")
        await expect(answer).to_be_enabled()

        await answer.fill('{"name": "Ada", "check": true, "integer": 7}')
        await question.get_by_role("button", name="Send answer").click()
        await expect(card(page, TOOL).locator(".question-outcome")).to_have_text(
            'Answered: {"name": "Ada", "check": true, "integer": 7}')
        tool = card(page, TOOL)
        await expect(tool).to_have_attribute("data-state", "ok")
        output = tool.locator(".tool-output")
        await expect(output).to_contain_text("User provided the requested information!")
        await expect(output).to_contain_text("- Name: Ada")
        await expect(output).to_contain_text("- Agreed to terms: true")
        await expect(output).to_contain_text("- Favorite Integer: 7")
        await expect(page.locator(".msg-assistant")).to_have_text(
            "The server received: Name: Ada; Agreed to terms: true; Favorite Integer: 7")
        await expect(page.locator(".composer")).not_to_have_attribute("data-status", "input_required")

        record = await ui.store.approvals.get(pending["question_id"])
        assert record is not None
        assert record.status == "answered"
        assert (await ui.api.get(f"/api/v1/chat/conversations/{cid}")).json()["pending"]["questions"] == []


async def test_decline_in_the_ui_is_the_mcp_servers_decline(tmp_path: Path, browser: Browser) -> None:
    async with forms_ui(tmp_path) as ui, opened(browser, ui.url) as (page, _):
        question = await asked(page)
        await question.get_by_role("button", name="Decline").click()
        tool = card(page, TOOL)
        await expect(tool.locator(".question-outcome")).to_have_text("Answered: Decline")
        await expect(tool).to_have_attribute("data-state", "ok")
        output = tool.locator(".tool-output")
        await expect(output).to_contain_text("User declined to provide the requested information.")
        await expect(output).to_contain_text('"action": "decline"')
        await expect(output).not_to_contain_text("Name:")
        await expect(page.locator(".msg-assistant")).to_have_text(
            "The server received: ❌ User declined to provide the requested information.")
