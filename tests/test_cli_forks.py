"""Forking in the CLI (issue 44): `/history`, `/fork`, `/edit`, `/result` and `/rerun` in `ringlet chat`, and
`ringlet conversations fork` on a stored conversation."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ringlet.cli import app
from ringlet.messages import Message, ToolCall
from ringlet.models import ModelRequest, providers
from ringlet.store import Store
from ringlet.testing import FunctionModel, ScriptedCall, call

runner = CliRunner()


def calculating(request: ModelRequest) -> str | ScriptedCall:
    """Asks `calculate` for a new question; then says what it answered."""
    last = request.messages[-1]
    return call("calculate", expression=last.text) if last.role == "user" else f"= {last.text}"


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> FunctionModel:
    scripted = FunctionModel(calculating, name="scripted:fork")
    real = providers.resolve_model

    def resolve(spec: Any, **options: Any) -> Any:
        return scripted if spec == "scripted:fork" else real(spec, **options)

    monkeypatch.setattr(providers, "resolve_model", resolve)
    monkeypatch.setenv("RINGLET_AGENTS_DIR", "/nonexistent")
    return scripted


def test_chat_forks_edits_replaces_and_reruns(model: FunctionModel) -> None:
    lines = ["2 + 3", "/history", "/result 3 41", "/edit 1 6 * 7", "/rerun 2", "/edit 2 nope", "/fork 1", "/fork 9",
             "/exit"]
    result = runner.invoke(app, ["chat", "assistant", "--model", "scripted:fork"], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    answers = re.findall(r"= \d+", result.stdout)
    assert answers == ["= 5", "= 41", "= 42", "= 42"]
    seen = [[(m.role, m.text) for m in r.messages] for r in model.requests]
    assert seen[2] == [("user", "2 + 3"), ("assistant", ""), ("tool", "41")]  # the replaced result, never run
    assert seen[3] == [("user", "6 * 7")]  # the edit: the history before it
    assert seen[5] == [("user", "6 * 7"), ("assistant", ""), ("tool", "42")]  # the call ran again
    assert len(model.requests) == 6  # /rerun's run starts with the call, not a model request
    assert "  3 tool calculate → 5" in result.stderr  # /history numbered them
    assert "only a user message can be edited" in result.stderr
    assert "forked at message 1; 1 kept" in result.stderr
    assert "a message number, 1 to 1" in result.stderr


def test_conversations_fork_copies_a_stored_conversation(tmp_path: Path) -> None:
    db = f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"

    async def seed() -> tuple[str, list[Message]]:
        store = await Store.open(db)
        try:
            made = await store.conversations.create(agent="assistant", title="sums")
            messages = [Message.user("2 + 3"), Message.assistant(tool_calls=[ToolCall(id="c1", name="calculate")]),
                        Message.tool("c1", "calculate", "5"), Message.assistant("= 5")]
            await store.conversations.append_messages(made.id, messages)
            return made.id, messages
        finally:
            await store.close()

    async def read(cid: str) -> tuple[Any, list[Message]]:
        store = await Store.open(db)
        try:
            return await store.conversations.get(cid), await store.conversations.load_messages(cid)
        finally:
            await store.close()

    cid, messages = asyncio.run(seed())
    result = runner.invoke(app, ["conversations", "fork", cid, "--at", messages[2].id, "--db", db])
    assert result.exit_code == 0, result.output
    new = result.stdout.strip()
    conversation, copied = asyncio.run(read(new))
    assert conversation.forked_from == {"conversation_id": cid, "message_id": messages[2].id}
    assert conversation.title == "sums (fork)"
    assert [(m.role, m.text) for m in copied] == [(m.role, m.text) for m in messages[:3]]
    assert [m.metadata["copied_from"] for m in copied] == [m.id for m in messages[:3]]
    assert [m.id for m in asyncio.run(read(cid))[1]] == [m.id for m in messages]  # the original untouched
    missing = runner.invoke(app, ["conversations", "fork", cid, "--at", "m_nope", "--db", db])
    assert missing.exit_code == 1
    assert "'m_nope' is not in this transcript" in missing.stderr
