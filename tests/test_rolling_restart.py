"""A rolling restart under load (issue 55, point 3): `bench/rolling_restart.py` with 2 API processes and 3
workers on PostgreSQL, each stopped with SIGTERM (it drains) and replaced, one after the other, while clients
talk over SSE (reconnecting with `Last-Event-ID`, retrying 503s on the other API process): no run fails, no
event is lost or doubled, each run ends exactly once, and the drained processes exit cleanly."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from rolling_restart import rolling_restart

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
async def test_restarting_every_process_one_by_one_under_load_loses_nothing(postgres_url: str,
                                                                             tmp_path: Path) -> None:
    report = await rolling_restart(concurrency=4, apis=2, workers=3, steady_s=3, drain_s=20,
                                   postgres_url=postgres_url, logs=tmp_path)  # (the processes' logs stay there)
    assert report["broken"] == {}
    assert report["exits"] == {"api -15": 2, "worker 0": 3}  # drained, not killed (uvicorn re-raises SIGTERM)
    assert report["restarting"]["n"] >= 4  # runs were under way while the processes restarted
    assert report["reconnects"] >= 1  # streams were ended by a draining API process, and followed elsewhere
    assert report["retracted"] == 0  # every worker finished its runs: none was handed on mid-way
