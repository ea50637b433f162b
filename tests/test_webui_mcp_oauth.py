"""Connecting an MCP server behind OAuth in the web UI: the run that needs the connection shows a question
with a "Connect" link; the user signs in on the authorization server's page (the official SDK's server-side
auth, `examples/mcp_oauth_server.py`), comes back to ringlet's callback route, and the run goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import Browser, expect

from browser import IN_SESSION_LOOP
from ringlet import Agent
from ringlet.mcp.oauth import LoopbackAuthorizer, OAuthConnector
from ringlet.mcp.tokens import MemoryVault, Sealer, new_key
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import ScriptedModel, call
from serving import serving
from test_mcp_oauth import files, oauth_server
from test_webui import card, choose, opened, say

pytestmark = [pytest.mark.slow, IN_SESSION_LOOP]
expect.set_options(timeout=15_000)


async def test_connect_in_the_ui_signs_in_and_the_run_goes_on(tmp_path: Path, browser: Browser) -> None:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'ringlet.db'}")
    async with oauth_server() as base:
        toolset = files(base, OAuthConnector(MemoryVault(), Sealer(new_key()), LoopbackAuthorizer()))
        agent = Agent(ScriptedModel([call("whoami", {}, id="w1"), "You are ana."]), name="files", tools=[toolset])
        app = create_app(ServerSettings(auth_mode="none", ping_interval_s=1.0), store=store, agents=[agent])
        try:
            async with serving(app) as url, opened(browser, url) as (page, watch):
                app.state.connections.base = url
                await choose(page, "files")
                await say(page, "who am I?")
                question = page.locator(".question[data-status=pending]")
                await expect(question.locator(".question-text")).to_contain_text(
                    "MCP server files needs you to connect your account")
                await expect(page.locator(".composer")).to_have_attribute("data-status", "input_required")
                connect = question.get_by_role("link", name="Connect")
                assert (await connect.get_attribute("href") or "").startswith(f"{base}/authorize?")
                async with page.expect_popup() as opening:
                    await connect.click()
                signin = await opening.value
                await signin.get_by_label("User").fill("ana")
                await signin.get_by_role("button", name="Sign in and allow ringlet").click()
                await expect(signin.locator("body")).to_contain_text("Connected.")
                tool = card(page, "whoami")
                await expect(tool).to_have_attribute("data-state", "ok")
                await expect(tool.locator(".tool-output")).to_contain_text("signed in as ana")
                await expect(page.locator(".msg-assistant")).to_have_text("You are ana.")
                await expect(page.locator(".composer")).not_to_have_attribute("data-status", "input_required")
                assert watch.errors == []
        finally:
            await toolset.aclose()
            await store.close()
