"""Guardrail decisions in the web UI (issue 56): each shows in the run as it happens, what a guardrail found
and, for a block, why, with the run's error after it; a model-graded guardrail's own cost is on its line."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, expect

from browser import IN_SESSION_LOOP
from ringlet import Agent, Gates
from ringlet.guardrails import Guardrails, ModelGuardrail, PiiGuardrail
from ringlet.models.base import ModelRequest
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import FunctionModel, Reply
from ringlet.usage import RequestUsage
from serving import serving
from test_webui import choose, opened, say

pytestmark = [pytest.mark.slow, IN_SESSION_LOOP]
expect.set_options(timeout=15_000)


def judge(request: ModelRequest) -> Reply:
    text = request.messages[-1].text
    verdict = "BLOCK: it asks about the vault combination" if "vault" in text else "ALLOW"
    return Reply(verdict, usage=RequestUsage(in_tokens=200, out_tokens=10))


@contextlib.asynccontextmanager
async def guarded_ui(tmp: Path) -> AsyncIterator[str]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp / 'ringlet.db'}")
    rails = Guardrails((PiiGuardrail(), ModelGuardrail(FunctionModel(judge, name="openai:gpt-4o-mini"),
                                                       "Nothing about the vault.", stages=frozenset({"input"}))))
    agent = Agent(FunctionModel(lambda r: f"Noted: {r.messages[-1].text}"), name="guarded",
                  gates=Gates(guardrails=rails))
    app = create_app(ServerSettings(auth_mode="none", ping_interval_s=1.0), store=store, agents=[agent])
    try:
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=30):
            yield url
    finally:
        await store.close()


async def test_decisions_show_in_the_run(tmp_path: Path, browser: Browser) -> None:
    async with guarded_ui(tmp_path) as url, opened(browser, url) as (page, _):
        await choose(page, "guarded")
        await say(page, "my email is zoe@atelier.example")
        redacted = page.locator('.guardrail[data-stage="input"][data-decision="redact"]')
        await expect(redacted).to_contain_text("pii redacted your message")
        await expect(redacted.locator(".guardrail-kinds")).to_have_text("email")
        graded = page.locator('.guardrail[data-guardrail="model_graded"][data-decision="allow"]')
        await expect(graded.locator(".guardrail-usage")).to_have_text("200 tok in · 10 tok out · $0.000036")
        await expect(page.locator(".msg-assistant").last).to_have_text("Noted: my email is [email]")

        await say(page, "what is the vault combination")
        blocked = page.locator('.guardrail[data-decision="block"]')
        await expect(blocked).to_contain_text("model_graded blocked your message")
        await expect(blocked.locator(".notice-message")).to_have_text("it asks about the vault combination")
        await expect(page.locator('.run-error[data-code="guardrail_blocked"]')).to_contain_text(
            "guardrail 'model_graded' blocked the message: it asks about the vault combination")
        shown: Any = await page.locator(".msg-assistant").all_inner_texts()
        assert not any("vault" in text for text in shown)  # the model never answered it
