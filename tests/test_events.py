"""The event union serialises 1:1 to the SSE contract (`server-contract.md` §4.2)."""

from __future__ import annotations

import typing

from inline_snapshot import snapshot

from ringlet import events as ev
from ringlet.events import event_adapter

BASE = {"run_id": "r_1", "ts": "2026-01-01T00:00:00.000Z"}


def test_payloads_match_the_contract() -> None:
    samples = [
        ev.MessageStartEvent(**BASE, message_id="m_1", conversation_id="c_1", agent="assistant"),
        ev.ContentDeltaEvent(**BASE, message_id="m_1", delta="Hel"),
        ev.ToolCallStartEvent(**BASE, tool_call_id="call_1", name="f", index=0),
        ev.ToolCallDeltaEvent(**BASE, tool_call_id="call_1", args_delta='{"a"'),
        ev.ToolResultEvent(**BASE, tool_call_id="call_1", name="f", result="ok", duration_ms=1.5),
        ev.ToolResultEvent(**BASE, tool_call_id="call_2", name="f", error={"code": "tool_timeout", "message": "m"},
                           is_error=True),
        ev.NotificationEvent(**BASE, level="progress", title="t", message="m", source="p",
                             progress=ev.Progress(current=1, total=3)),
        ev.StatusEvent(**BASE, state="working"),
        ev.MessageEndEvent(**BASE, message_id="m_1", finish_reason="end_turn",
                           usage={"in_tokens": 1, "out_tokens": 2, "cost_usd": None}),
        ev.ErrorEvent(**BASE, code="empty_stop", message="blank"),
        ev.ContentDeltaEvent(**BASE, message_id="m_2", delta="x", agent_path=("root", "child"),
                             parent_tool_call_id="call_9", depth=1),
    ]
    assert [s.model_dump() for s in samples] == snapshot([
        {"run_id": "r_1", "ts": "2026-01-01T00:00:00.000Z", "type": "message_start", "message_id": "m_1",
         "conversation_id": "c_1", "agent": "assistant", "role": "assistant"},
        {"run_id": "r_1", "ts": "2026-01-01T00:00:00.000Z", "type": "content_delta", "message_id": "m_1",
         "delta": "Hel"},
        {"run_id": "r_1", "ts": "2026-01-01T00:00:00.000Z", "type": "tool_call_start", "tool_call_id": "call_1",
         "name": "f", "connector": None, "index": 0},
        {"run_id": "r_1", "ts": "2026-01-01T00:00:00.000Z", "type": "tool_call_delta", "tool_call_id": "call_1",
         "args_delta": '{"a"'},
        {"run_id": "r_1", "ts": "2026-01-01T00:00:00.000Z", "type": "tool_result", "tool_call_id": "call_1",
         "name": "f", "result": "ok", "is_error": False, "duration_ms": 1.5, "truncated": False},
        {"run_id": "r_1", "ts": "2026-01-01T00:00:00.000Z", "type": "tool_result", "tool_call_id": "call_2",
         "name": "f", "error": {"code": "tool_timeout", "message": "m"}, "is_error": True, "duration_ms": 0.0,
         "truncated": False},
        {"run_id": "r_1", "ts": "2026-01-01T00:00:00.000Z", "type": "notification", "level": "progress",
         "title": "t", "message": "m", "source": "p", "progress": {"current": 1.0, "total": 3.0}},
        {"run_id": "r_1", "ts": "2026-01-01T00:00:00.000Z", "type": "status", "state": "working"},
        {"run_id": "r_1", "ts": "2026-01-01T00:00:00.000Z", "type": "message_end", "message_id": "m_1",
         "finish_reason": "end_turn", "usage": {"in_tokens": 1, "out_tokens": 2, "cost_usd": None}},
        {"run_id": "r_1", "ts": "2026-01-01T00:00:00.000Z", "type": "error", "code": "empty_stop",
         "message": "blank", "retryable": False},
        {"run_id": "r_1", "ts": "2026-01-01T00:00:00.000Z", "agent_path": ["root", "child"],
         "parent_tool_call_id": "call_9", "depth": 1, "type": "content_delta", "message_id": "m_2", "delta": "x"},
    ])


def test_every_event_type_round_trips_through_the_union() -> None:
    members = typing.get_args(typing.get_args(ev.Event)[0])
    names = {m.__dataclass_fields__["type"].default for m in members}
    assert names == {"message_start", "content_delta", "tool_call_start", "tool_call_delta", "tool_result",
                     "approval_required", "question", "notification", "status", "compaction", "node_start",
                     "node_end", "retracted", "guardrail", "steer_queued", "steer_taken", "message_end", "error",
                     "ping"}
    sample = ev.QuestionEvent(**BASE, question_id="q_1", question="Which?", input_type="single-select",
                              options=(ev.QuestionOption(label="a"),))
    assert event_adapter.validate_python(sample.model_dump() | {"type": "question"}) == sample
    end = ev.MessageEndEvent(**BASE, message_id="m", finish_reason="error", usage={})
    assert event_adapter.validate_json(end.model_dump_json()) == end
    guarded = ev.GuardrailEvent(**BASE, guardrail="pii", stage="input", decision="redact", kinds=("email",),
                                message_id="m_1")
    assert guarded.model_dump() == {**BASE, "type": "guardrail", "guardrail": "pii", "stage": "input",
                                    "decision": "redact", "kinds": ["email"], "message_id": "m_1"}
    assert event_adapter.validate_json(guarded.model_dump_json()) == guarded


def test_ping_has_an_empty_payload() -> None:
    assert ev.PingEvent().model_dump() == {}
