"""Every transaction of one durable turn: who made it, what it did, and whether it stands apart.

Starts a private PostgreSQL server (like the tests', `tests/postgres.py`) that logs every statement with its
session and virtual transaction id, the streaming mock model of `server_load.py`, and `ringlet serve` on that
PostgreSQL (runs are DBOS workflows). It warms up (two turns), listens to the idle server for `--idle` seconds,
then runs one turn (a conversation is created, then one message is sent and its SSE stream read up to
`message_end`) and waits until the server's transactions go back to the idle ones.

Who made a transaction is told by its session: ringlet's store (asyncpg, no application name), DBOS's system
database (psycopg; `PGAPPNAME=dbos` is set for the server, and only libpq reads it), the heartbeat thread (its
`INSERT INTO workers`), DBOS's notification listener (`LISTEN` on a psycopg session) and ringlet's feed
(`application_name` `ringlet-feed …`). A transaction is a session's local transaction id (`%v`); `log_statement
= all` logs each simple statement and each `execute` inside its transaction, and `log_min_duration_statement =
0` adds each `parse` (a statement prepared on its own, outside any `BEGIN`, is a transaction of its own: asyncpg
prepares before it executes). A session's local ids count up by one per transaction, so a gap is a transaction
that logged nothing; they are counted too. The turn's total is checked against `pg_stat_database`'s
`xact_commit` + `xact_rollback` over the same span (its figures are flushed when the server stops).

Timers (the heartbeat, the dead-worker check, DBOS's queue and scheduler polls) run during the turn as when
idle; the table lists them apart, at their idle rate, so the turn's own transactions are what is left.

Run: `.venv/bin/python bench/commits.py [--idle 10] [--turns 1] [--show]` (`--show`: each transaction's
statements, abridged).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # server_load
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from server_load import cpu_seconds, free_port, ringlet_prepare, ringlet_send, start, stop, wait_ready

PREFIX = "%m|%c|%v|%a|"
LINE = re.compile(r"^(?P<ts>\S+ \S+ \S+)\|(?P<session>[^|]*)\|(?P<vxid>[^|]*)\|(?P<app>[^|]*)\|"
                  r"(?P<level>[A-Z]+):  (?P<text>.*)$")
MARK = "ringlet_commits_mark"
HERE = Path(__file__).resolve().parent


@dataclass
class Transaction:
    session: str
    lxid: int
    statements: list[str] = field(default_factory=list)
    app: str = ""
    first: str = ""

    @property
    def ended(self) -> str:
        last = self.statements[-1].strip().upper() if self.statements else ""
        return "rollback" if last.startswith("ROLLBACK") else "commit"


def _sql(text: str) -> str | None:
    """The statement of a log line's text (None: a line of no statement)."""
    for pattern in (r"^statement: (.*)", r"^execute [^:]*: (.*)", r"^duration: \S+ ms  parse [^:]*: (.*)"):
        if m := re.match(pattern, text, re.S):
            return ("PARSE " if "parse" in pattern else "") + m.group(1)
    return None


def read_log(path: Path) -> list[tuple[str, str, str, str, str]]:
    """(ts, session, vxid, app, sql) of each statement line, continuation lines joined."""
    out: list[list[str | None]] = []
    for raw in path.read_text(errors="replace").splitlines():
        m = LINE.match(raw)
        if m is None:
            if out and raw.startswith("\t") and out[-1][4] is not None:
                out[-1][4] += " " + raw.strip()  # type: ignore[operator]
            continue
        sql = _sql(m["text"]) if m["level"] == "LOG" else None
        out.append([m["ts"], m["session"], m["vxid"], m["app"], sql])
    return [(a, b, c, d, e) for a, b, c, d, e in out if e]  # type: ignore[misc]


def transactions(lines: list[tuple[str, str, str, str, str]], *, whole: bool = False) -> list[Transaction]:
    """The transactions the lines belong to, in the order they started; a session's unlogged ones (gaps in
    its local ids) as transactions of no statement; `whole`: every session began within the lines (so its
    ids before the first logged one are unlogged transactions too: a connection's start)."""
    by_key: dict[tuple[str, int], Transaction] = {}
    for _ts, session, vxid, app, sql in lines:
        lxid = int(vxid.split("/")[1]) if "/" in vxid else 0
        key = (session, lxid)
        if key not in by_key:
            by_key[key] = Transaction(session, lxid, app=app)
        by_key[key].statements.append(sql)
    out = list(by_key.values())
    per_session: dict[str, list[int]] = defaultdict(list)
    for t in out:
        per_session[t.session].append(t.lxid)
    for session, ids in per_session.items():
        ids.sort()
        app = next(t.app for t in out if t.session == session)
        for a, b in itertools.pairwise([0, *ids] if whole else ids):
            out += [Transaction(session, gap, app=app) for gap in range(a + 1, b)]
    return out


def who(t: Transaction, listens: set[str]) -> str:
    """Who made a transaction, by its session."""
    if t.session in listens and not t.app.startswith("ringlet-feed"):
        return "DBOS notifier"
    if t.app.startswith("ringlet-feed"):
        return "ringlet feed"
    if t.app == "dbos_transact":  # DBOS's pool of its system database
        return "DBOS"
    if t.app == "dbos":  # libpq's PGAPPNAME: a psycopg connection of its own
        return "heartbeat thread"
    return "ringlet store"


TIMERS = [  # (who, a statement pattern, the timer's name): what an idle server does, by whom and how often
    ("heartbeat thread", r"INSERT INTO workers", "ringlet heartbeat (`heartbeat_s`)"),
    ("ringlet store", r"FROM workers", "ringlet dead-worker check (`heartbeat_s`)"),
    ("ringlet feed", r"^SELECT 1$", "ringlet feed's keep-alive"),
    ("DBOS", r"dbos\.queues\.application_name", "DBOS queue manager: list queues (1 s, fixed)"),
    ("DBOS", r"FROM dbos\.queues WHERE", "DBOS queue poll: reload its row (each poll)"),
    ("DBOS", r"dbos\.application_versions", "DBOS queue poll: claim (`polling_interval_sec`)"),  # (none claimed)
    ("DBOS", r"workflow_schedules", "DBOS scheduler (`scheduler_polling_interval_sec`)"),
    ("DBOS", r"pg_try_advisory_xact_lock", "DBOS background jobs: lock (1 s, fixed)"),
    ("DBOS", r"^UPDATE dbos\.workflow_status .*(is_debounced|workflow_deadline_epoch_ms <=)",
     "DBOS background jobs: sweeps (1 s, fixed)"),
    ("DBOS", r"^$", "DBOS background jobs: lock held, released (1 s, fixed)"),
    ("DBOS", r"^DEALLOCATE ALL", "psycopg: forget prepared statements after a ROLLBACK"),
]


def timer(t: Transaction, listens: set[str]) -> str | None:
    by = who(t, listens)
    if any(s.startswith("UPDATE dbos.workflow_status SET status=$1::VARCHAR, executor_id") for s in t.statements):
        return None  # a queue's claim that claimed a workflow: the turn's own
    for owner, pattern, name in TIMERS:
        if owner == by and any(re.search(pattern, s) for s in _work(t) or [""]):
            return name
    return None


def _work(t: Transaction) -> list[str]:
    """The statements of a transaction other than its control and what it prepares."""
    return [s for s in t.statements if not s.upper().startswith(("PARSE ", "BEGIN", "COMMIT", "ROLLBACK", "SET "))]


def what(t: Transaction) -> str:
    """A short signature: the statements' verbs and tables (what is prepared apart: psycopg prepares a statement
    once it ran five times on a connection, asyncpg once per connection)."""
    if not t.statements:
        return "(no statement logged)"
    parts = []
    for s in _work(t):
        s1 = re.sub(r"\s+", " ", s.replace('"', "")).strip()
        m = re.match(r"(SELECT|INSERT INTO|UPDATE|DELETE FROM|WITH|LISTEN|UNLISTEN|NOTIFY)\b(.*)", s1, re.I)
        if m is None:
            parts.append(s1[:40])
            continue
        verb, rest = m.group(1).upper(), m.group(2)
        if verb in ("INSERT INTO", "UPDATE", "DELETE FROM"):
            table = rest.split()[0] if rest.split() else ""
        elif "pg_notify" in rest:
            table = "pg_notify"
        elif "advisory" in rest:
            table = "advisory lock"
        else:
            tm = re.search(r"\bFROM\s+([\w.]+)", rest, re.I)
            table = tm.group(1) if tm else rest.strip()[:30]
        parts.append(f"{verb.split()[0].lower()} {table}")
    return ", ".join(dict.fromkeys(parts)) or "(only transaction control)"


async def stats(db: str) -> int:
    conn = await asyncpg.connect(db, server_settings={"application_name": "bench"})
    try:
        return await conn.fetchval("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                                   "WHERE datname = current_database()")
    finally:
        await conn.close()


async def mark(db: str, label: str) -> None:
    conn = await asyncpg.connect(db, server_settings={"application_name": "bench"})
    try:
        await conn.execute(f"SELECT '{MARK} {label}'")
    finally:
        await conn.close()


def between(lines: list[tuple[str, str, str, str, str]], a: str, b: str | None, *,
            bench: bool = False) -> list[tuple[str, str, str, str, str]]:
    """The lines between the marks `a` and `b` (None: the end), without the bench's own unless `bench`."""
    start = next(i for i, line in enumerate(lines) if f"{MARK} {a}" in line[4])
    end = len(lines) if b is None else next(i for i, line in enumerate(lines) if f"{MARK} {b}" in line[4])
    return [line for line in lines[start + 1:end] if bench or line[3] != "bench"]


def idle_table(txs: list[Transaction], listens: set[str], span: float) -> None:
    count = Counter((who(t, listens), timer(t, listens) or what(t)) for t in txs)
    print(f"\nidle: transactions per second, by timer ({span:.1f} s listened to): {len(txs) / span:.1f}")
    for (w, name), n in sorted(count.items(), key=lambda kv: -kv[1]):
        print(f"{n / span:>7.2f}/s  {w:<16} {name}")


def turn_table(txs: list[Transaction], listens: set[str], turns: int, *, show: bool) -> None:
    count = Counter((who(t, listens), t.ended, what(t)) for t in txs)
    print(f"\nper turn: the turn's own transactions (timers left out): {len(txs) / turns:.1f}")
    print(f"{'count':>6}  {'who':<16} {'ends':<8} what")
    for (w, e, sig), n in sorted(count.items(), key=lambda kv: (kv[0][0], -kv[1])):
        print(f"{n / turns:>6.1f}  {w:<16} {e:<8} {sig}")
    if show:
        for t in txs:
            print(f"  {who(t, listens):<16} {t.session}/{t.lxid}: " + " ; ".join(s[:90] for s in t.statements))


def postgres_cpu(data: Path) -> float:
    """CPU seconds of the PostgreSQL server's processes (the postmaster and its children)."""
    postmaster = int((data / "postmaster.pid").read_text().split()[0])
    total = cpu_seconds(postmaster)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                    total += cpu_seconds(int(entry.name))
    return total


async def bench(url: str, log: Path, idle_s: float, turns: int, *, show: bool, keep: str | None) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ringlet-commits-"))
    mock_port, port = free_port(), free_port()
    mock_base, base = f"http://127.0.0.1:{mock_port}", f"http://127.0.0.1:{port}"
    (tmp / "agents" / "bench").mkdir(parents=True)
    (tmp / "agents" / "bench" / "config.yaml").write_text(
        "description: commit accounting agent\nmodel: openai:mock\n"
        f'model_options: {{base_url: "{mock_base}/v1", api_key: "not-needed"}}\ninstructions: Answer briefly.\n')
    mock = start([sys.executable, str(HERE / "server_load.py"), "--mock-port", str(mock_port)], tmp / "mock.log")
    await mark(url, "life-begin")
    life = await stats(url)
    os.environ["PGAPPNAME"] = "dbos"  # libpq's (psycopg: DBOS's notifier, the heartbeat); asyncpg does not read it
    server = start([sys.executable, "-m", "ringlet", "serve", "--host", "127.0.0.1", "--port", str(port), "--db",
                    url, "--agents", str(tmp / "agents"), "--auth", "none"], tmp / "ringlet.log")
    del os.environ["PGAPPNAME"]
    try:
        await wait_ready(f"{mock_base}/health", mock)
        await wait_ready(f"{base}/readyz", server)
        async with httpx.AsyncClient(timeout=60) as client:
            for _ in range(2):  # warm-up: prepared statements, pools, DBOS's first workflow
                if not await ringlet_send(client, base, await ringlet_prepare(client, base)):
                    raise RuntimeError("a warm-up turn failed")
            await asyncio.sleep(2)
            await mark(url, "idle-begin")
            began, cpu, pg_cpu = time.monotonic(), cpu_seconds(server.pid), postgres_cpu(log.parent / "data")
            await asyncio.sleep(idle_s)
            cpu, pg_cpu = cpu_seconds(server.pid) - cpu, postgres_cpu(log.parent / "data") - pg_cpu
            idle_span = time.monotonic() - began
            await mark(url, "idle-end")
            await mark(url, "turn-begin")
            for _ in range(turns):
                if not await ringlet_send(client, base, await ringlet_prepare(client, base)):
                    raise RuntimeError("the turn failed")
            await asyncio.sleep(2)  # what the run does after `message_end` (its workflow's end, the watcher)
            await mark(url, "turn-end")
        stop(server)
        await asyncio.sleep(1)  # an exiting backend reports its statistics at once
        life = await stats(url) - life
    finally:
        stop(server)
        stop(mock)
        notes = [line for line in (tmp / "ringlet.log").read_text(errors="replace").splitlines()
                 if not line.startswith(("INFO:", "ringlet serving at"))]
        if notes:
            print("ringlet serve's log, other than INFO (last lines):\n" + "\n".join(notes[-20:]))
        shutil.rmtree(tmp, ignore_errors=True)
    if keep:
        shutil.copy(log, keep)
    report(read_log(log), idle_span, turns, show=show, life=life)
    print(f"\nidle CPU: ringlet serve {cpu * 1000 / idle_span:.1f} ms/s, "
          f"PostgreSQL {pg_cpu * 1000 / idle_span:.1f} ms/s")


def report(lines: list[tuple[str, str, str, str, str]], idle_span: float, turns: int, *, show: bool, life: int) -> None:
    listens = {session for _ts, session, _v, _a, sql in lines if sql.upper().startswith("LISTEN")}
    idle = transactions(between(lines, "idle-begin", "idle-end"))
    idle_table(idle, listens, idle_span)
    turn = transactions(between(lines, "turn-begin", "turn-end"))
    own = [t for t in turn if timer(t, listens) is None]
    turn_table(own, listens, turns, show=show)
    logged = transactions(between(lines, "life-begin", None, bench=True))
    starts = len(transactions(between(lines, "life-begin", None, bench=True), whole=True)) - len(logged)
    print(f"\ncheck: over the server's life (start, warm-up, idle, turn, stop; bench's own transactions too) the "
          f"log shows {len(logged)} transactions (and {starts} local ids before a session's first statement: "
          f"connections' starts), pg_stat_database counts {life} commits + rollbacks")


async def log_statements(db: str, *, durations: bool = True) -> Path:
    """Have the PostgreSQL server at `db` log every statement with its session and transaction (`PREFIX`),
    autovacuum off; returns the folder its log goes to."""
    conn = await asyncpg.connect(db, server_settings={"application_name": "bench"})
    try:
        settings = [("log_statement", "all"), ("log_line_prefix", PREFIX), ("autovacuum", "off")]
        if durations:
            settings.append(("log_min_duration_statement", "0"))
        for name, value in settings:
            await conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        await conn.execute("SELECT pg_reload_conf()")
        return Path(await conn.fetchval("SHOW data_directory")).parent / "log"
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=float, default=10, help="seconds of idle listened to")
    parser.add_argument("--turns", type=int, default=1, help="turns one after another")
    parser.add_argument("--show", action="store_true", help="print each transaction of the turn")
    parser.add_argument("--keep", default=None, help="copy PostgreSQL's log there")
    args = parser.parse_args()
    from postgres import postgres_server

    with postgres_server() as url:
        db = url.replace("postgresql+asyncpg://", "postgresql://")

        log = asyncio.run(log_statements(db))
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(bench(db, log, args.idle, args.turns, show=args.show, keep=args.keep))


if __name__ == "__main__":
    main()
