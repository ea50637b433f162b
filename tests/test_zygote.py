"""The fork server the tests start their `ringlet` processes from (`tests/zygote.py`, `processes.Forked`):
a forked process must be what `python -m ringlet` would be, with only the imports shared."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from processes import Forked, free_port, ringlet_process

HERE = Path(__file__).parent

READS = """
import importlib, json, os, sys
sys.path.insert(0, sys.argv[1])
read = set()
def reader():
    frame = sys._getframe(2)
    while frame.f_code.co_filename in (os.__file__, "<frozen _collections_abc>", "<frozen os>"):
        frame = frame.f_back
    return frame.f_code.co_filename
class Watched(type(os.environ)):
    def __getitem__(self, key):
        if "/ringlet/" in reader():
            read.add(key)
        return super().__getitem__(key)
    def __contains__(self, key):
        if "/ringlet/" in reader():
            read.add(key)
        return super().__contains__(key)
os.environ = Watched(os.environ._data, os.environ.encodekey, os.environ.decodekey, os.environ.encodevalue,
                     os.environ.decodevalue)
import zygote
for name in zygote.modules():
    importlib.import_module(name)
print(json.dumps(sorted(read)))
"""


def test_no_module_the_fork_server_imports_reads_ringlets_environment() -> None:
    """A forked process gets its environment after the imports: a variable ringlet read at import time would
    keep the fork server's value (as `RINGLET_TEST_CRASH_AT` did, read once by `runs/crash.py`)."""
    out = subprocess.run([sys.executable, "-c", READS, str(HERE)], capture_output=True, text=True, check=True,
                         env={**os.environ, "RINGLET_TEST_CRASH_AT": "after_record"})
    assert json.loads(out.stdout.splitlines()[-1]) == []


async def test_a_forked_process_has_its_own_environment_and_folder_and_dies_by_a_signal(tmp_path: Path) -> None:
    """The environment is the request's: without `RINGLET_AUTH_MODE=none`, which the fork server's own
    environment lacks, the server would answer 401 (/proc/PID/environ is the fork server's: it shows what a
    process was started with, not its environment after a fork)."""
    assert "RINGLET_AUTH_MODE" not in os.environ
    env = {**os.environ, "RINGLET_AUTH_MODE": "none"}
    port = free_port()
    db = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
    async with ringlet_process(["serve", "--port", str(port), "--db", db, "--agents", str(tmp_path)],
                               b"Uvicorn running on", env) as process, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        assert (await client.get("/api/v1/agents")).status_code == 200
        assert os.readlink(f"/proc/{process.pid}/cwd") == os.getcwd()
        process.kill()
        assert await process.wait() == -signal.SIGKILL
        assert process.returncode == -signal.SIGKILL


async def test_a_forked_process_exits_with_its_own_code_and_error() -> None:
    process = await Forked.start(["serve", "--no-such-option"], dict(os.environ))
    try:
        assert await process.wait() == 2  # click's usage error
        assert b"--no-such-option" in await process.stderr.read()
    finally:
        process.close()
