"""What the durable mode costs (issue 40): runs start when they are enqueued, not at a queue's next poll;
an answer's streamed deltas share commits; DBOS's records of ended runs are deleted after the retention."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from processes import free_port, ringlet_process
from ringlet.store import Store
from ringlet.store.writer import EventWriter
from serving import serving
from test_durable import CONFIG, TOOLS_PY, Upstream, cluster, database, start, text

SLOW_POLL = {"RINGLET_QUEUE_POLL_S": "3600", "RINGLET_FIRE_POLL_S": "3600"}
"""Queues looked at once an hour: a run that ends within the test was taken when it was enqueued, not by a poll
(the tests' timeouts only keep a run left for the poll from hanging the suite)."""


def _answer(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return text("all ", "done")


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
async def test_a_run_starts_when_enqueued_not_at_the_next_poll(tmp_path: Path, postgres_url: str,
                                                               workers: int) -> None:
    """The API process executes no runs: it tells the workers (NOTIFY) and one takes each run at once."""
    async with cluster(tmp_path, postgres_url, Upstream(_answer), workers=workers, **SLOW_POLL) as c:
        async with asyncio.timeout(60):  # a run left for the poll would wait an hour
            for _ in range(3):
                _, watch = await start(c, "go")
                assert watch.sending is not None
                reply = (await watch.sending).json()
                assert reply["status"] == "completed", reply


@pytest.mark.slow
async def test_a_serving_process_takes_its_own_runs_at_once(tmp_path: Path, postgres_url: str) -> None:
    """`ringlet serve` (API and worker) takes the run it enqueued itself, without waiting for a poll."""
    async with serving(Upstream(_answer).app()) as model_url, database(postgres_url) as db:
        agent = tmp_path / "agents" / "worker"
        agent.mkdir(parents=True)
        (agent / "config.yaml").write_text(CONFIG.format(url=model_url))
        (agent / "tools.py").write_text(TOOLS_PY)
        port = free_port()
        env = {"RINGLET_AUTH_MODE": "none", "EFFECTS": str(tmp_path / "effects"), **SLOW_POLL}
        serve = ["serve", "--port", str(port), "--db", db, "--agents", str(tmp_path / "agents")]
        async with ringlet_process(serve, b"Uvicorn running on", env), \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client, asyncio.timeout(60):
            for _ in range(3):
                cid = (await client.post("/api/v1/chat/conversations", json={"agent": "worker"})).json()["id"]
                reply = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "go"},
                                          headers={"Accept": "application/json"})
                assert reply.json()["status"] == "completed", reply.text


FORGOTTEN = """
CREATE FUNCTION public.tell_workflow_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_notify('workflow_gone', OLD.workflow_uuid); RETURN OLD; END $$;
CREATE TRIGGER workflow_gone AFTER DELETE ON dbos.workflow_status
FOR EACH ROW EXECUTE FUNCTION public.tell_workflow_gone();
"""
"""A NOTIFY on `workflow_gone` with the id of each workflow whose DBOS records are deleted (one transaction
deletes a workflow's status, input, output and steps: `SystemDatabase._delete_workflows`)."""


@pytest.mark.slow
async def test_dbos_records_of_ended_runs_go_with_the_retention(tmp_path: Path, postgres_url: str) -> None:
    """With a retention of ~2 s, a finished run's workflow records are deleted by the upkeep; its own record
    and transcript stay (they are ringlet's). The test waits for the deletion itself: a trigger on DBOS's
    status table tells it (NOTIFY) when the run's row goes."""
    settings = {"RINGLET_EVENTS_RETENTION_HOURS": str(2 / 3600), "RINGLET_SWEEP_INTERVAL_S": "0.5",
                "RINGLET_RUN_LEASE_S": "1.5"}
    async with cluster(tmp_path, postgres_url, Upstream(_answer), workers=1, **settings) as c:
        cid, watch = await start(c, "go")
        assert watch.sending is not None
        run_id = (await watch.sending).json()["run_id"]
        conn = await asyncpg.connect(c.db.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            async def rows() -> int:
                return sum([await conn.fetchval(f"SELECT count(*) FROM dbos.{table} WHERE workflow_uuid = $1", run_id)
                            for table in ("workflow_status", "workflow_input", "operation_outputs")])

            gone: asyncio.Queue[str] = asyncio.Queue()
            await conn.add_listener("workflow_gone", lambda *args: gone.put_nowait(args[-1]))
            await conn.execute(FORGOTTEN)
            assert await rows() > 0  # recorded while it ran (and after the trigger was made: its end is told)
            async with asyncio.timeout(60):  # only a guard: the upkeep sweeps every 0.5 s
                while await gone.get() != run_id:
                    pass
            assert await rows() == 0
            assert await conn.fetchval("SELECT status FROM runs WHERE id = $1", run_id) == "completed"
            assert await conn.fetchval("SELECT count(*) FROM messages WHERE conversation_id = $1", cid) == 2
        finally:
            await conn.close()


async def test_events_within_the_commit_window_share_a_commit(tmp_path: Path) -> None:
    """A token after a quiet spell is committed alone and at once; tokens within the window after it wait
    (here the window is an hour: until something hurries them) and share one commit; any other event has
    what waits written at once. Without a window, each token goes on its own, unhurried."""
    store = await Store.open(f"sqlite:///{tmp_path}/s.db")
    batches: list[int] = []
    append = store.events.append_batch

    async def counted(batch: Any) -> list[int]:
        batches.append(len(batch))
        return await append(batch)

    store.events.append_batch = counted  # type: ignore[method-assign]
    delta = {"message_id": "m", "delta": "x"}
    try:
        cid = (await store.conversations.create(agent="a")).id

        async def waiting(writer: EventWriter) -> list[asyncio.Future[int]]:
            """A token committed alone and at once, then two that wait for the window."""
            batches.clear()
            await writer.append(cid, "content_delta", delta, linger=True)
            assert batches == [1]
            tokens = [asyncio.ensure_future(writer.append(cid, "content_delta", delta, linger=True))
                      for _ in range(2)]
            await asyncio.to_thread(lambda: None)  # a thread's answer: the tokens' and the writer's steps ran before
            assert batches == [1]
            assert not any(t.done() for t in tokens)
            return tokens

        async with asyncio.timeout(30):  # only a guard: nothing here waits for time to pass
            writer = EventWriter(store, window_s=3600)
            tokens = await waiting(writer)
            writer.hurry()  # someone waits for them
            ids = await asyncio.gather(*tokens)
            assert batches == [1, 2]
            assert ids == sorted(set(ids))  # in order, each once
            await writer.close()

            writer = EventWriter(store, window_s=3600)  # a quiet spell again
            tokens = await waiting(writer)
            other = await writer.append(cid, "tool_call_start", delta)  # not a token: written at once, with them
            assert batches == [1, 3]
            assert [*await asyncio.gather(*tokens), other] == sorted({*[t.result() for t in tokens], other})
            await writer.close()

            batches.clear()
            writer = EventWriter(store)
            for _ in range(3):
                await writer.append(cid, "content_delta", delta, linger=True)
            assert batches == [1, 1, 1]
            await writer.close()
    finally:
        await store.close()
