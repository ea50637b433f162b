"""`retracted` (issue 39): an abandoned model attempt's text and calls, withdrawn. Each protocol shows what a
client assembles without them, never the two attempts spliced: the shared reader drops the text; `/v1`
goes on only while the new attempt repeats what the client has, else ends with a retryable error; AG-UI
ends what is open, sends the stored transcript and streams the message again under a new id; A2A replaces
its answer artifact. A run closed after a retraction keeps none of the withdrawn attempt."""

from __future__ import annotations

from typing import Any

from ringlet.events import RetractedEvent, ToolResultEvent
from ringlet.server.durable.attempts import SUPERSEDED, Logged, retraction
from ringlet.server.durable.reconcile import reconciled
from ringlet.server.protocols.a2a.follow import Follow
from ringlet.server.protocols.agui.translator import Translator
from ringlet.server.protocols.events import Retraction, RunReader
from ringlet.server.protocols.openai.encoder import Encoder
from ringlet.server.runs.active import ActiveRun
from ringlet.store.records import RunRecord, Usage

RUN = "r_1"


def start() -> tuple[str, dict[str, Any]]:
    return "message_start", {"run_id": RUN, "message_id": "m_1", "agent": "a"}


def delta(text: str, message_id: str = "m_1") -> tuple[str, dict[str, Any]]:
    return "content_delta", {"run_id": RUN, "message_id": message_id, "delta": text}


def retracted(message_id: str | None = "m_1", calls: tuple[str, ...] = ()) -> tuple[str, dict[str, Any]]:
    return "retracted", RetractedEvent(run_id=RUN, ts="t", message_id=message_id, tool_call_ids=calls).model_dump()


def end() -> tuple[str, dict[str, Any]]:
    return "message_end", {"run_id": RUN, "message_id": "m_1", "finish_reason": "end_turn",
                           "usage": {"in_tokens": 1, "out_tokens": 1}}


def test_the_reader_drops_the_withdrawn_text() -> None:
    reader = RunReader()
    for event in (start(), delta("First"), delta(" try")):
        reader.feed(*event)
    withdrawn = reader.feed(*retracted())
    assert withdrawn == Retraction("m_1", (), "First try")
    for event in (delta("Another"), delta(" answer")):
        reader.feed(*event)
    assert reader.messages == ["Another answer"]


def test_v1_goes_on_while_the_new_attempt_repeats_what_the_client_has() -> None:
    encoder = Encoder(model="a")
    sent = [encoder.feed(*e) for e in (start(), delta("Par"), delta("tial"), retracted(), delta("Pa"),
                                       delta("rtial an"), delta("swer"), end())]
    assert "".join(s for s in sent if s) == "Partial answer"
    assert not encoder.withdrawn


def test_v1_ends_when_the_new_attempt_says_something_else() -> None:
    encoder = Encoder(model="a")
    for e in (start(), delta("First"), delta(" try"), retracted(), delta("Another")):
        encoder.feed(*e)
    assert encoder.withdrawn
    assert encoder.content() == "Another"  # a completion (not streamed) simply has the new answer


def test_v1_ends_when_the_new_attempt_says_less() -> None:
    encoder = Encoder(model="a")
    for e in (start(), delta("First"), delta(" try"), retracted(), delta("First"), end()):
        encoder.feed(*e)
    assert encoder.withdrawn


def test_agui_ends_the_message_resyncs_and_streams_it_again_under_a_new_id() -> None:
    translator = Translator(thread_id="t", run_id=RUN, client_run="c")
    out = [ev for e in (start(), delta("First"), retracted()) for ev in translator.feed(*e)]
    assert [ev.type.value for ev in out] == ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"]
    assert translator.resync
    again = translator.feed(*delta("Another"))
    assert [ev.type.value for ev in again] == ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT"]
    assert again[0].message_id not in ("m_1", out[0].message_id)  # type: ignore[attr-defined]


class Queue:
    """Collects what the A2A executor enqueues."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    async def enqueue_event(self, event: Any) -> None:
        self.events.append(event)


async def test_a2a_replaces_the_answer_artifact() -> None:
    queue = Queue()
    follow = Follow(queue=queue, run_id=RUN, cid="c", context_id="ctx")  # type: ignore[arg-type]
    for e in (start(), delta("Done. "), delta("Next", "m_2"), retracted("m_2"), delta("Other", "m_2")):
        await follow._encode(None, *e)  # type: ignore[arg-type]
    updates = [(ev.append, ev.artifact.parts[0].text) for ev in queue.events]
    assert updates == [(False, "Done. "), (True, "Next"), (False, "Done. "), (True, "Other")]


def test_the_closing_events_settle_every_open_call_of_the_lost_attempt() -> None:
    logged = Logged.of([start(), ("status", {"run_id": RUN, "state": "working"}),
                        ("tool_call_start", {"run_id": RUN, "tool_call_id": "c_done", "name": "f", "index": 0}),
                        ("tool_result", {"run_id": RUN, "tool_call_id": "c_done", "name": "f"}),
                        delta("Let me", "m_2"),
                        ("tool_call_start", {"run_id": RUN, "tool_call_id": "c_lost", "name": "g", "index": 0})])
    run = ActiveRun(RUN, "c", "a")
    run.replay = logged.replay
    for kind, key in (("message_start", "m_1"), ("status", None), ("tool_call_start", "c_done"),
                      ("tool_result", "c_done")):  # what the replay matched of the finished steps
        found = next(k for k in run.replay if k[:2] == (kind, key))
        run.replay[found] -= 1
        if not run.replay[found]:
            del run.replay[found]
    closing = retraction(run, logged.open_calls)
    assert [type(e) for e in closing] == [ToolResultEvent, RetractedEvent]
    result, withdrawn = closing
    assert (result.tool_call_id, result.name, result.error) == ("c_lost", "g", SUPERSEDED)  # type: ignore[union-attr]
    assert (withdrawn.message_id, withdrawn.tool_call_ids) == ("m_2", ("c_lost",))  # type: ignore[union-attr]
    assert not run.replay  # what follows is the new attempt: stored and sent
    assert retraction(run, logged.open_calls) == []


def test_a_run_closed_after_a_retraction_keeps_nothing_of_the_withdrawn_attempt() -> None:
    row = RunRecord(id=RUN, agent="a", kind="loop", status="working", started_at="t", usage=Usage(),
                    conversation_id="c")
    log = [(1, *start()), (2, *delta("Lost text", "m_2")),
           (3, "tool_call_start", {"run_id": RUN, "tool_call_id": "c_lost", "name": "g", "index": 0}),
           (4, "tool_result", {"run_id": RUN, "tool_call_id": "c_lost", "name": "g", "is_error": True,
                               "error": SUPERSEDED}),
           (5, *retracted("m_2", ("c_lost",))), (6, *delta("Kept", "m_2"))]
    plan = reconciled(row, log, [])
    assert [(m.role, m.text) for m in plan.messages] == [("assistant", "Kept")]
    assert not any(getattr(e, "tool_call_id", None) == "c_lost" for e in plan.events)
