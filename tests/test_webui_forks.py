"""Forking in the web UI (issue 44): "Edit" (edit and run from here) on a user message, "Fork here" on any
message, "Replace result" and "Run again" on a tool call, and the mark of a forked conversation linking to its
origin. A real server on loopback and Debian's Chromium, as in test_webui.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.async_api import Browser, expect

from browser import IN_SESSION_LOOP
from test_webui import card, choose, opened, say, shot, ui_server

pytestmark = [pytest.mark.slow, IN_SESSION_LOOP]


async def test_edit_fork_and_replace_a_result_from_the_transcript(tmp_path: Path, browser: Browser) -> None:
    async with ui_server(tmp_path) as ui, opened(browser, ui.url) as (page, watch):
        await choose(page, "adder")
        await say(page, "Add 2 and 3")
        await expect(page.locator(".run-usage")).to_be_visible()
        origin = (await ui.api.get("/api/v1/chat/conversations")).json()["data"][0]
        user = page.locator(".msg-user")
        await expect(user).to_have_text(["Add 2 and 3"])  # the actions add no text to the message

        # edit and run from here: a new conversation, its run followed, the original untouched
        await user.hover()
        await page.get_by_role("button", name="Edit").click()
        box = page.locator(".fork-edit textarea")
        await expect(box).to_have_value("Add 2 and 3")
        await box.fill("Add 4 and 5")
        await page.get_by_role("button", name="Run from here").click()
        await expect(page).not_to_have_url(re.compile(re.escape(origin["id"])))
        await expect(page.locator(".msg-user")).to_have_text(["Add 4 and 5"])
        await expect(page.locator(".msg-assistant")).to_contain_text("The sum is 5.")
        await expect(page.locator(".run-usage")).to_be_visible()
        mark = page.locator(".transcript .fork-mark")
        await expect(mark).to_contain_text("Forked from “Add 2 and 3”")
        await expect(page.locator(".conv-item")).to_have_count(2)
        await expect(page.locator(".conv-item .fork-chip")).to_have_count(1)
        await expect(page.locator(".conv-item .conv-title")).to_have_text(["Add 4 and 5", "Add 2 and 3"])
        fork_id = page.url.rsplit("/", 1)[-1]
        listed = {c["id"]: c for c in (await ui.api.get("/api/v1/chat/conversations")).json()["data"]}
        assert listed[fork_id]["forked_from"]["conversation_id"] == origin["id"]
        await shot(page, "forks-01-edited")

        # reopened (a reload): the copy, the run and the mark come back from the store
        await page.reload()
        await expect(page.locator(".msg-user")).to_have_text(["Add 4 and 5"])
        await expect(card(page, "add")).to_have_count(1)
        await expect(page.locator(".transcript .fork-mark")).to_be_visible()

        # fork here at the answer: a copy, no run
        answer = page.locator(".msg-assistant")
        await answer.hover()
        await answer.get_by_role("button", name="Fork here").click()
        await expect(page).not_to_have_url(re.compile(re.escape(fork_id)))
        await expect(page.locator(".conv-item")).to_have_count(3)
        await expect(page.locator(".msg-assistant")).to_contain_text("The sum is 5.")
        await expect(page.locator(".msg-user")).to_have_text(["Add 4 and 5"])
        copy_id = page.url.rsplit("/", 1)[-1]
        detail = (await ui.api.get(f"/api/v1/chat/conversations/{copy_id}")).json()
        assert detail["conversation"]["forked_from"]["conversation_id"] == fork_id
        assert detail["conversation"]["status"] == "idle"

        # the mark links back to the origin
        await page.locator(".transcript .fork-origin").click()
        await expect(page).to_have_url(re.compile(re.escape(fork_id) + "$"))
        await expect(page.locator(".msg-user")).to_have_text(["Add 4 and 5"])

        # a tool call's result replaced: the model goes on from what the human wrote, nothing runs again
        await page.goto(f"{ui.url}/#/c/{origin['id']}")
        added = card(page, "add")
        await expect(added).to_contain_text("5")
        await added.hover()
        await added.get_by_role("button", name="Replace result").click()
        await added.locator("textarea").fill("7")
        await added.get_by_role("button", name="Go on with this result").click()
        await expect(page).not_to_have_url(re.compile(re.escape(origin["id"])))
        await expect(page.locator(".conv-item")).to_have_count(4)
        await expect(card(page, "add").locator(".tool-result")).to_contain_text("7")
        await expect(page.locator(".run-usage")).to_be_visible()
        replaced = page.url.rsplit("/", 1)[-1]
        messages = (await ui.api.get(f"/api/v1/chat/conversations/{replaced}")).json()["messages"]
        assert [(m["role"], m["metadata"].get("replaced")) for m in messages if m["role"] == "tool"] == [("tool", True)]
        assert watch.errors == []


async def test_run_again_shows_the_call_once_live_and_after_a_reload(tmp_path: Path, browser: Browser) -> None:
    """The fork's copy of the call (stored outside any run, marked to run again) and the run that runs it
    are one card: no "not run yet" card above the result."""
    async with ui_server(tmp_path) as ui, opened(browser, ui.url) as (page, watch):
        await choose(page, "adder")
        await say(page, "Add 2 and 3")
        await expect(page.locator(".run-usage")).to_be_visible()
        origin = page.url.rsplit("/", 1)[-1]
        added = card(page, "add")
        await added.hover()
        await added.get_by_role("button", name="Run again").click()
        await expect(page).not_to_have_url(re.compile(re.escape(origin)))
        await expect(page.locator(".run-usage")).to_be_visible()
        fork_id = page.url.rsplit("/", 1)[-1]
        messages = (await ui.api.get(f"/api/v1/chat/conversations/{fork_id}")).json()["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]  # the call ran again
        for shown in ("live", "reloaded"):
            await expect(card(page, "add"), shown).to_have_count(1)
            await expect(card(page, "add").locator(".tool-status"), shown).to_have_text("done")
            await expect(card(page, "add").locator(".tool-result"), shown).to_contain_text("5")
            await expect(page.locator(".msg-assistant"), shown).to_contain_text("The sum is 5.")
            if shown == "live":
                await shot(page, "forks-02-run-again")
                await page.reload()
                await expect(page.locator(".msg-user")).to_have_text(["Add 2 and 3"])
        assert watch.errors == []


async def test_run_again_of_a_gated_call_asks_on_its_one_card(tmp_path: Path, browser: Browser) -> None:
    """A call run again goes through its approval again: the approval is on the call's one card, live and after
    a reload (the run paused, none of its own messages stored yet), and the result lands there."""
    async with ui_server(tmp_path) as ui, opened(browser, ui.url) as (page, watch):
        await choose(page, "ops")
        await say(page, "deploy")
        await card(page, "deploy").get_by_role("button", name="Allow").click()
        await expect(page.locator(".run-usage")).to_be_visible()
        origin = page.url.rsplit("/", 1)[-1]
        await card(page, "deploy").hover()
        await card(page, "deploy").get_by_role("button", name="Run again").click()
        await expect(page).not_to_have_url(re.compile(re.escape(origin)))
        for shown in ("live", "reloaded"):
            await expect(card(page, "deploy"), shown).to_have_count(1)
            await expect(card(page, "deploy").locator(".approval[data-status=pending]"), shown).to_be_visible()
            if shown == "live":
                await page.reload()
        await card(page, "deploy").get_by_role("button", name="Allow").click()
        await expect(page.locator(".run-usage")).to_be_visible()
        await expect(card(page, "deploy")).to_have_count(1)
        await expect(card(page, "deploy").locator(".tool-status")).to_have_text("done")
        assert watch.errors == []
