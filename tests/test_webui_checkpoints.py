"""A graph run's checkpoints in the web UI (issue 44): under an ended graph run, "Checkpoints" lists its
super-steps; choosing one shows its state, one editor per key; a key that does not fit says why under its
editor, and "Fork from step N" starts the fork in a new conversation, which opens. A real server on loopback
and Debian's Chromium, as in test_webui.py."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, expect

from browser import IN_SESSION_LOOP
from ringlet.server import ServerSettings, create_app
from ringlet.server.catalog import Catalog, HostedGraph
from ringlet.store import Store
from serving import serving
from test_graph_fork import FILES, GRAPH
from test_graph_support import make_graph
from test_webui import choose, opened, say, shot

pytestmark = [pytest.mark.slow, IN_SESSION_LOOP]


@contextlib.asynccontextmanager
async def chain_server(tmp: Path) -> AsyncIterator[tuple[str, httpx.AsyncClient, Path]]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp / 'ringlet.db'}")
    chain = make_graph(tmp / "agents", GRAPH.replace("name: g", "name: chain"), name="chain", files=FILES)
    app = create_app(ServerSettings(auth_mode="none", ping_interval_s=1.0), store=store,
                     agents=Catalog([HostedGraph.at(chain)]))
    try:
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as api:
            yield url, api, chain
    finally:
        await store.close()


async def test_fork_a_graph_run_from_a_checkpoint_with_its_state_edited(tmp_path: Path, browser: Browser) -> None:
    async with chain_server(tmp_path) as (url, api, chain), opened(browser, url) as (page, watch):
        await choose(page, "chain")
        await say(page, "go")
        await expect(page.locator(".msg-assistant")).to_contain_text('Paris 11 ["a","b"]')
        origin = page.url.rsplit("/", 1)[-1]
        await page.get_by_role("button", name="Checkpoints").click()
        steps = page.locator(".checkpoint-step")
        await expect(steps).to_have_count(5)
        await expect(steps.nth(2)).to_have_text("step 2 → c")
        await expect(steps.nth(4)).to_be_disabled()  # the run's end: nothing left to run
        await steps.nth(2).click()
        city = page.get_by_label("State key city")
        await expect(city).to_have_value("Paris")
        trail = page.get_by_label("State key trail")
        await expect(trail).to_have_value('[\n  "a",\n  "b"\n]')

        # a value that does not fit the state: the server's reason under its editor, nothing starts
        await trail.fill('"x"')
        await page.get_by_role("button", name="Fork from step 2").click()
        await expect(page.locator(".state-key[data-key=trail] .state-error")).to_contain_text("reducer 'append'")
        await expect(page).to_have_url(re.compile(re.escape(origin) + "$"))
        await trail.fill('["a", "b"]')
        await city.fill("Oslo")
        await shot(page, "checkpoints-01-editor")
        await page.get_by_role("button", name="Fork from step 2").click()

        await expect(page).not_to_have_url(re.compile(re.escape(origin)))
        await expect(page.locator(".msg-assistant")).to_contain_text('Oslo 11 ["a","b"]')
        await expect(page.locator(".msg-user .user-text")).to_have_text(["go"])  # the original prompt,
        await expect(page.locator(".msg-user .chip.source")).to_have_text("fork")  # marked as a fork's
        await expect(page.locator(".transcript .fork-mark")).to_be_visible()
        await shot(page, "checkpoints-02-forked")
        assert (chain / "side.log").read_text().split() == ["a", "b", "c", "c"]  # from step 2 on
        fork_id = page.url.rsplit("/", 1)[-1]
        detail = (await api.get(f"/api/v1/chat/conversations/{fork_id}")).json()
        assert detail["conversation"]["forked_from"]["conversation_id"] == origin
        assert watch.errors == []
