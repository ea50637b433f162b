"""Steering from the web UI's composer, in Debian's Chromium: while a run works, the composer offers Steer
(Enter) and Queue; a steered message shows as queued, then joins the run where the run took it; a queued one
starts the next run once this one ends."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, expect

from browser import IN_SESSION_LOOP
from ringlet import Agent, tool
from ringlet.models.base import ModelRequest
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import FunctionModel, call
from serving import serving
from test_webui import card, choose, opened, say, shot

pytestmark = [pytest.mark.slow, IN_SESSION_LOOP]


class Gate:
    """The tool `look` waits until `open()`; each run's call waits on a new gate (`again()`)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def open(self) -> None:
        self.event.set()

    def again(self) -> None:
        self.event = asyncio.Event()


def agent_of(gate: Gate) -> Agent:
    @tool(effect="read")
    async def look(topic: str) -> str:
        "Look something up."
        await gate.event.wait()
        return f"notes on {topic}"

    def model(request: ModelRequest) -> Any:
        last = request.messages[-1]
        if last.role == "user" and last.text == "go":
            return call("look", {"topic": "logs"})
        return "seen: " + " | ".join(m.text for m in request.messages if m.role == "user")

    return Agent(FunctionModel(model), name="steered", tools=[look])


@asynccontextmanager
async def server(tmp: Path, gate: Gate) -> AsyncIterator[str]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp / 'ringlet.db'}")
    app = create_app(ServerSettings(auth_mode="none", ping_interval_s=1.0), store=store, agents=[agent_of(gate)])
    try:
        async with serving(app) as url:
            yield url
            gate.open()  # a run still waiting ends, so the server stops at once
    finally:
        await store.close()


async def test_steer_and_queue_from_the_composer_while_a_run_works(tmp_path: Path, browser: Browser) -> None:
    gate = Gate()
    async with server(tmp_path, gate) as url, opened(browser, url) as (page, _):
        await choose(page, "steered")
        await expect(page.locator("#steer")).to_be_hidden()  # nothing works yet: a plain Send
        await say(page, "go")
        await expect(card(page, "look")).to_have_attribute("data-state", "running")
        await expect(page.locator("#steer")).to_be_visible()
        await expect(page.locator("#queue")).to_be_visible()
        await expect(page.locator("#send")).to_be_hidden()
        await say(page, "only the errors")  # Enter steers while the run works
        steered = page.locator(".msg-user.steer", has_text="only the errors")
        await expect(steered).to_have_attribute("data-state", "queued")
        await expect(steered.locator(".steer-state")).to_have_text(re.compile("next step"))
        await expect(steered).to_have_attribute("data-message-id", re.compile("^m_"))  # the server has it
        await shot(page, "steering-01-queued")
        gate.open()
        await expect(steered).to_have_attribute("data-state", "taken")
        run = page.locator(".run").last
        await expect(run.locator(".msg-user", has_text="only the errors")).to_have_count(1)  # inside the run
        await expect(run.locator(".msg-assistant").last).to_have_text("seen: go | only the errors")
        await expect(page.locator("#send")).to_be_visible()
        await shot(page, "steering-02-taken")

        gate.again()
        await say(page, "go")
        await expect(card(page, "look").last).to_have_attribute("data-state", "running")
        await page.locator("#composer-input").fill("and then this")
        await page.locator("#queue").click()
        queued = page.locator(".msg-user", has_text="and then this")
        await expect(queued).to_have_attribute("data-state", "next")
        await expect(queued.locator(".steer-state")).to_have_text(re.compile("once this run ends"))
        gate.open()
        await expect(queued.locator(".steer-state")).to_have_count(0)  # its run started
        await expect(page.locator(".msg-assistant").last).to_have_text(re.compile(r"and then this$"))

        await page.reload()  # the stored transcript draws the steered message inside its run too
        first_run = page.locator(".run").first
        await expect(first_run.locator(".msg-user", has_text="only the errors")).to_have_count(1)
