"""Structured logs (issue 55 §2): `RINGLET_LOG_FORMAT=json` writes one JSON object a line with the run's ids,
and neither a secret nor a message's text appears, even at DEBUG. A real `ringlet serve` process."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from processes import free_port
from ringlet import logs
from ringlet.store import Store
from serving import serving
from test_durable import Upstream, calls, ringlet_process, text

SECRET = "sk-proj-TOPSECRETvalue0123456789"
MESSAGE = "my grandmother's maiden name is Quillfeather"
TOOLS = '''
import logging
import subprocess
import sys

def note(n: int) -> str:
    """Note a number."""
    logging.getLogger("ringlet.tools.note").warning("note called with %d", n)
    return "noted"
'''


async def test_json_logs_carry_run_ids_and_never_secrets_or_contents(tmp_path: Path) -> None:
    upstream = Upstream(lambda messages: text("Quillfeather ", "noted") if messages[-1]["role"] == "tool"
                        else calls("note"))
    db = f"sqlite:///{tmp_path / 'ringlet.db'}"
    store = await Store.open(db)
    key, _ = await store.keys.create("ops", scopes=["chat"])
    await store.close()
    agent = tmp_path / "agents" / "noter"
    agent.mkdir(parents=True)
    (agent / "tools.py").write_text(TOOLS)
    log = tmp_path / "serve.log"
    port = free_port()
    async with serving(upstream.app()) as model_url:
        (agent / "config.yaml").write_text(f"model: openai:m\nmodel_options: {{base_url: '{model_url}/v1', "
                                           f"api_key: {SECRET}}}\ntools:\n  note: {{effect: read}}\n")
        env = {"RINGLET_LOG_FORMAT": "json", "RINGLET_LOG_LEVEL": "DEBUG"}
        args = ["serve", "--port", str(port), "--db", db, "--agents", str(tmp_path / "agents")]
        async with ringlet_process(args, b"Uvicorn running on", env, log), \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                  headers={"Authorization": f"Bearer {key}"}) as client:
            cid = (await client.post("/api/v1/chat/conversations", json={"agent": "noter"})).json()["id"]
            done = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": MESSAGE},
                                     headers={"Accept": "application/json"})
            assert done.status_code == 200, done.text
            token = (await client.post("/api/v1/stream-tokens")).json()["token"]
            async with client.stream("GET", f"/api/v1/chat/conversations/{cid}/events", headers={"Authorization": ""},
                                     params={"stream_token": token, "last_event_id": 0}) as events:
                assert events.status_code == 200
                async for line in events.aiter_lines():  # the run's events, replayed from the log
                    if line == "event: message_end":
                        break
            refused = await client.get("/api/v1/agents", headers={"Authorization": f"Bearer {SECRET}"})
            assert refused.status_code == 401
    assert upstream.requests  # the model was asked, with the secret as its key
    raw = log.read_text()
    lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    for secret in (SECRET, key, token, MESSAGE, "Quillfeather"):
        assert secret not in raw
    noted = next(line for line in lines if line["message"] == "note called with 0")
    assert noted["conversation_id"] == cid
    assert noted["run_id"].startswith("r")
    assert noted["realm"] == "default"
    assert any(line["logger"] == "uvicorn.access" for line in lines)  # access lines too, their tokens masked


@pytest.mark.parametrize("line", [
    "Authorization: Bearer rk_abcdefghijklmnop", "GET /x?stream_token=st_0123456789abcdef&after=1",
    "key sk-abcdefghijklmnopqrstuvwx in a message", '{"authorization": "Bearer abc.def"}'])
def test_redact_masks_keys_and_tokens(line: str) -> None:
    masked = logs.redact(line)
    assert "***" in masked
    for secret in ("rk_abcdefghijklmnop", "st_0123456789abcdef", "sk-abcdefghijklmnopqrstuvwx", "abc.def"):
        assert secret not in masked


def test_the_json_formatter_adds_bound_ids() -> None:
    record = logging.LogRecord("ringlet.x", logging.INFO, __file__, 1, "hello %s", ("there",), None)
    with logs.bound("run_1", "c_1", "blue"):
        line = json.loads(logs.JsonFormatter().format(record))
    assert line["message"] == "hello there"
    assert (line["run_id"], line["conversation_id"], line["realm"], line["level"]) == ("run_1", "c_1", "blue", "INFO")
    assert "run_id" not in json.loads(logs.JsonFormatter().format(record))
    from ringlet.server import ops  # the server adds the request's id
    from ringlet.server.http.errors import request_id

    assert ops.install
    token = request_id.set("req_42")
    try:
        assert json.loads(logs.JsonFormatter().format(record))["request_id"] == "req_42"
    finally:
        request_id.reset(token)


def test_a_run_s_log_lines_carry_its_trace_id_when_tracing_is_on() -> None:
    """With an OpenTelemetry SDK configured (a process of its own: the tracer provider is global), a line a
    tool logs carries the run's id and the trace id of its `invoke_agent` span."""
    code = """
import json, logging
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
provider = TracerProvider(); provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
from ringlet import Agent, logs, tool
from ringlet.testing import ScriptedModel, call
lines = []
class Keep(logging.Handler):
    def emit(self, record):
        lines.append(json.loads(logs.JsonFormatter().format(record)))
logging.getLogger("ringlet.tools.ping").addHandler(Keep())
@tool
def ping() -> str:
    "p"
    logging.getLogger("ringlet.tools.ping").warning("pinged")
    return "pong"
result = Agent(ScriptedModel([call("ping"), "ok"]), tools=[ping], name="demo").run_sync("x")
root = next(s for s in exporter.get_finished_spans() if s.name == "invoke_agent demo")
print(json.dumps({"line": lines[0], "trace_id": format(root.context.trace_id, "032x"), "run_id": result.run_id}))
"""
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert out["line"]["message"] == "pinged"
    assert out["line"]["trace_id"] == out["trace_id"]
    assert out["line"]["run_id"] == out["run_id"]
