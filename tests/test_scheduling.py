"""The order pytest-xdist hands tests out in (scheduling.py), checked on a small suite of its own run as the
Makefile runs the real one: the tests of a module of `ONE_PROCESS` stay in one process, the `slow` tests go
out before the quick ones, and the rest go one test at a time."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scheduling import ONE_PROCESS

TESTS = Path(__file__).parent
RECORD = """
import os
from pathlib import Path

def record(name):
    with Path(os.environ["RECORD"]).open("a") as out:
        out.write(f"{os.environ['PYTEST_XDIST_WORKER']} {name}\\n")
"""


def test_the_makefile_hands_tests_out_one_at_a_time() -> None:
    makefile = (TESTS.parent / "Makefile").read_text()
    assert re.search(r"^PYTEST := .* -n \$\(WORKERS\) --dist load$", makefile, re.MULTILINE)
    assert all((TESTS.parent / module).is_file() for module in ONE_PROCESS)


@pytest.mark.slow
def test_slow_tests_go_out_first_and_a_shared_modules_tests_stay_in_one_process(tmp_path: Path) -> None:
    suite = tmp_path / "tests"
    suite.mkdir()
    (suite / "conftest.py").write_text(
        "from scheduling import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401\n")
    (suite / "record.py").write_text(RECORD)
    (suite / "test_fast.py").write_text("from record import record\n" + "".join(
        f"def test_{i}():\n    record('fast')\n" for i in range(8)))
    shared = suite.parent / sorted(ONE_PROCESS)[0]  # a module of ONE_PROCESS: its tests share a fixture
    shared.write_text("from record import record\n" + "".join(
        f"def test_{i}():\n    record('shared')\n" for i in range(3)))
    (suite / "test_slow.py").write_text("import pytest\nfrom record import record\n" + "".join(
        f"@pytest.mark.slow\ndef test_{i}():\n    record('slow')\n" for i in range(3)))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers = slow: slow\n")
    record = tmp_path / "record.txt"
    env = {**os.environ, "RECORD": str(record),
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(suite), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "load", "-p", "no:cacheprovider",
                           "-q", "tests"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    ran: dict[str, list[str]] = {}
    for line in record.read_text().splitlines():
        worker, kind = line.split()
        ran.setdefault(worker, []).append(kind)
    assert sorted(kind for kinds in ran.values() for kind in kinds) == ["fast"] * 8 + ["shared"] * 3 + ["slow"] * 3
    assert [kinds.count("shared") for kinds in ran.values() if "shared" in kinds] == [3]  # in one process
    order = {"shared": 0, "slow": 1, "fast": 2}  # the module (the largest unit), the slow tests, then the rest
    for kinds in ran.values():
        assert kinds == sorted(kinds, key=order.__getitem__), ran
    assert sorted(ran) == ["gw0", "gw1"]
    assert all("fast" in kinds for kinds in ran.values()), ran  # spread one by one


def test_a_test_not_marked_slow_that_takes_longer_is_named_at_the_end(tmp_path: Path) -> None:
    suite = tmp_path / "tests"
    suite.mkdir()
    (suite / "conftest.py").write_text("from scheduling import pytest_addoption, pytest_runtest_logreport, "
                                       "pytest_terminal_summary  # noqa: F401\n")
    (suite / "test_some.py").write_text("import pytest\n\ndef test_unmarked():\n    assert True\n\n"
                                        "@pytest.mark.slow\ndef test_marked():\n    assert True\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers = slow: slow\nslow_after_s = -1\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # a plain pytest starts in a fraction of the time
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 tests not marked slow took over -1 s" in done.stdout
    named = done.stdout.split("took over -1 s", 1)[1]
    assert "test_some.py::test_unmarked" in named
    assert "test_marked" not in named
