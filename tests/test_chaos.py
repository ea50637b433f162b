"""A small run of `bench/chaos.py` (issue 39): two API processes and three workers on PostgreSQL, workers
SIGKILLed at random moments and an API process once, a model double that answers anew every time; every
run must end, its client must have seen each event once, every call settled once, the transcript and the
log's replay must be what the client assembled, and the non-idempotent tool must never run twice."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from chaos import chaos

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
async def test_every_run_is_exact_whatever_dies(postgres_url: str) -> None:
    report = await chaos(conversations=24, concurrency=8, kill_every=(0.8, 2.0), api_kills=1, seed=7,
                         postgres_url=postgres_url)
    assert report["broken"] == {}
    assert report["once_twice"] == []
    assert report["completed"] == 24
    assert sum(report["kills"].values()) >= 1
