"""Debian's Chromium for the web UI's tests, one per test process: launching it (and Playwright's driver)
costs seconds, a browser context costs milliseconds, and a context is as isolated as a new browser
(cookies, storage, cache). `browser` is a session fixture living in the session's event loop, so a test
that uses it runs there too: mark its module `pytestmark = [..., IN_SESSION_LOOP]`."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from playwright.async_api import Browser, async_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
IN_SESSION_LOOP = pytest.mark.asyncio(loop_scope="session")
"""The mark of a module whose tests use `browser` (its objects belong to the session's event loop)."""


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    """One Chromium for this test process; each test opens a context of its own (`test_webui.opened`)."""
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium package (apt-get install chromium)")
    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()
