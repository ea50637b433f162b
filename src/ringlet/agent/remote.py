"""Remote sub-agents over A2A (the official `a2a-sdk` client): `a2a:<agent card URL>` names one.

    sub_agents:
      allowed: ["a2a:https://host/a2a/helper/.well-known/agent-card.json#token_env=HELPER_KEY"]

`spawn_agent(agent="a2a:…")` fetches the card, sends the task as one A2A message (streaming when the card
says so) and returns the remote task's final text as the call's result. The fragment is read here and never
sent: `token_env=NAME` sends `Authorization: Bearer $NAME` (the card request too). The child is an ordinary
`Spawnable` to `subagents.ChildRun`: its stream yields `message_start`, the remote text as `content_delta`s
and `message_end`, which the parent's stream carries as a sub-agent's events, and its `result` says how it
ended. A remote task that stops `input-required` is a failure saying what the remote agent asks (nobody
here can answer it on the remote's behalf); an unreachable remote, a refused key or a bad card is a failure
naming the cause, never a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, urldefrag, urlsplit

import httpx
from a2a.client import A2ACardResolver, A2AClientError, Client, ClientConfig, ClientFactory
from a2a.helpers import get_artifact_text, get_message_text, new_text_message
from a2a.types.a2a_pb2 import CancelTaskRequest, Role, SendMessageRequest, StreamResponse, Task, TaskState
from a2a.utils.errors import A2AError

from ringlet._ids import SYSTEM
from ringlet.agent.contract import RunSettings
from ringlet.context import Caller
from ringlet.errors import ConfigError
from ringlet.events import ContentDeltaEvent, MessageEndEvent, MessageStartEvent, NotificationEvent
from ringlet.loop.fields import new_dict
from ringlet.messages import Message
from ringlet.usage import Usage

PREFIX = "a2a:"
_ENDED = {TaskState.TASK_STATE_COMPLETED: "completed", TaskState.TASK_STATE_FAILED: "failed",
          TaskState.TASK_STATE_CANCELED: "canceled", TaskState.TASK_STATE_REJECTED: "failed"}
_ASKING = {TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED}


@dataclass
class RemoteAgent:
    """A remote A2A agent as a sub-agent. `name` is its reference (`a2a:<card URL>[#token_env=NAME]`),
    which is what `sub_agents.allowed` lists and `spawn_agent` names."""

    card_url: str
    token_env: str | None = None
    headers: Mapping[str, str] = field(default_factory=new_dict)
    name: str = ""
    timeout_s: float = 30.0
    """Connect and card timeouts; the task itself has the sub-agent's own time limit."""

    @classmethod
    def of(cls, reference: str) -> RemoteAgent:
        """`a2a:<card URL>`, optionally with `#token_env=NAME` (read here, never sent)."""
        url, fragment = urldefrag(reference.removeprefix(PREFIX))
        options = dict(parse_qsl(fragment))
        unknown = set(options) - {"token_env"}
        if not url.startswith(("http://", "https://")) or unknown:
            raise ValueError(f"{reference!r}: an A2A sub-agent is `a2a:<http(s) URL of its agent card>` with "
                             f"an optional `#token_env=NAME`{f' (unknown: {sorted(unknown)})' if unknown else ''}")
        return cls(url, token_env=options.get("token_env"), name=reference)

    kind: Literal["remote"] = field(default="remote", init=False, repr=False)
    """What shape of run it starts (`ringlet.agent.contract.RunKind`): a task elsewhere, never paused here."""

    def stream(self, prompt: Any, /, *, history: Sequence[Message] = (), caller: Caller | None = None,
               settings: RunSettings | None = None) -> RemoteStream:
        """The remote task for `prompt` (its text is sent; `history` and `settings` stay here: the remote
        agent keeps its own context and limits)."""
        message = prompt if isinstance(prompt, Message) else Message(  # the system seam: not replayed (below)
            id=SYSTEM.new_id("m"), role="user", created_at=SYSTEM.stamp(),
            content=prompt if isinstance(prompt, str) else _last_user_text(prompt))
        return RemoteStream(self, message, caller.conversation_id if caller is not None else None)

    def resume_stream(self, paused: Any, decisions: Mapping[str, Any] | None = None, /) -> RemoteStream:
        """Never: a remote task that stops for input is a failure here (nobody here can answer for it)."""
        raise ConfigError(f"{self.name}: a remote A2A task cannot be resumed here")

    async def aclose(self) -> None:
        """Nothing to close: each task has its own HTTP client."""

    def http_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.token_env:
            token = os.environ.get(self.token_env)
            if not token:
                raise _RemoteFailure(f"the environment variable {self.token_env} (its bearer token) is not set")
            headers["Authorization"] = f"Bearer {token}"
        return headers


class _RemoteFailure(Exception):
    """Why a remote task could not run or gave no answer (becomes the call's `sub_agent_failed`)."""


@dataclass
class RemoteState:
    """What a host keeps of the child (`Children.closed`): the prompt and the answer, no usage (the remote's
    own)."""

    messages: list[Message]
    history_length: int = 0
    usage: Usage = field(default_factory=Usage)


@dataclass
class RemoteResult:
    """How the remote task ended, shaped like a `RunResult` for `ChildRun.result_of`."""

    run_id: str
    output: str | None
    status: str
    finish_reason: str | None
    usage: Usage = field(default_factory=Usage)
    error: dict[str, Any] | None = None


class RemoteStream:
    """One remote task as a child's stream: iterate it for the events; then read `result` and `state`."""

    def __init__(self, remote: RemoteAgent, prompt: Message, conversation_id: str | None) -> None:
        self.remote, self.prompt, self.conversation_id = remote, prompt, conversation_id
        # the system seam: a remote task is not replayed (a durable parent records its result, not its events)
        self.run_id, self.message_id = SYSTEM.new_id("r"), SYSTEM.new_id("m")
        self.result: RemoteResult | None = None
        self.state = RemoteState([prompt])
        self.task_id: str | None = None

    @property
    def paused(self) -> bool:
        """Never: a remote task asking for input fails (`RemoteAgent`)."""
        return False

    def steer(self, text: str, /) -> Any:
        """A remote task takes no steers here (A2A sends a task one message)."""
        raise ConfigError(f"the remote agent {self.remote.name!r} cannot be steered mid-task")

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._events()

    async def _events(self) -> AsyncIterator[Any]:
        yield MessageStartEvent(run_id=self.run_id, ts=SYSTEM.stamp(), message_id=self.message_id,
                                conversation_id=self.conversation_id, agent=self.remote.name)
        follow = _Follow()
        try:
            async with httpx.AsyncClient(headers=self.remote.http_headers(), timeout=httpx.Timeout(
                    self.remote.timeout_s, read=None)) as http:
                client = await _client(http, self.remote)
                request = SendMessageRequest(message=new_text_message(self.prompt.text, role=Role.ROLE_USER))
                try:
                    async for response in client.send_message(request):
                        for delta in follow.take(response):
                            yield ContentDeltaEvent(run_id=self.run_id, ts=SYSTEM.stamp(), message_id=self.message_id,
                                                    delta=delta)
                        self.task_id = follow.task_id or self.task_id
                except asyncio.CancelledError:
                    await _cancel(client, self.task_id)
                    raise
            self.result = follow.outcome(self.run_id)
        except _RemoteFailure as exc:
            self.result = _failed(self.run_id, str(exc))
        except (A2AClientError, A2AError, httpx.HTTPError, ValueError) as exc:
            self.result = _failed(self.run_id, _reason(exc))
        if self.result.status == "input_required":
            yield NotificationEvent(run_id=self.run_id, ts=SYSTEM.stamp(), level="warning",
                                    title="remote agent needs input", source=self.remote.name,
                                    message=(self.result.error or {}).get("message", ""))
            self.result.status = "failed"
        if self.result.output:
            self.state.messages.append(Message.assistant(self.result.output, source="a2a"))
        yield MessageEndEvent(run_id=self.run_id, ts=SYSTEM.stamp(), message_id=self.message_id,
                              finish_reason="end_turn" if self.result.status == "completed" else "error",
                              usage=self.result.usage.as_dict())


async def _client(http: httpx.AsyncClient, remote: RemoteAgent) -> Client:
    """The SDK client for the card at `remote.card_url` (JSON-RPC or HTTP+JSON, streaming if it streams)."""
    try:
        card = await A2ACardResolver(http, remote.card_url).get_agent_card(relative_card_path="/")
    except A2AClientError as exc:
        raise _RemoteFailure(f"cannot read the agent card at {remote.card_url}: {exc}") from None
    if remote.token_env:  # the token goes only where the card came from, never to a host the card names
        home = urlsplit(remote.card_url)[:2]
        elsewhere = [i.url for i in card.supported_interfaces if urlsplit(i.url)[:2] != home]
        if elsewhere:
            raise _RemoteFailure(f"the agent card at {remote.card_url} sends requests to {elsewhere[0]}, another "
                                "origin; its token is not sent there (use that origin's card)")
    config = ClientConfig(httpx_client=http, streaming=card.capabilities.streaming,
                          supported_protocol_bindings=["JSONRPC", "HTTP+JSON"])
    try:
        return ClientFactory(config).create(card)
    except ValueError as exc:
        raise _RemoteFailure(f"the agent card at {remote.card_url} offers no transport this client speaks: "
                            f"{exc}") from None


async def _cancel(client: Client, task_id: str | None) -> None:
    """The parent was cancelled (or the child's time ran out): cancel the remote task too, if it can be."""
    if task_id is None:
        return
    with contextlib.suppress(Exception):
        async with asyncio.timeout(5):
            await asyncio.shield(client.cancel_task(CancelTaskRequest(id=task_id)))


@dataclass
class _Follow:
    """The remote task as its responses arrive: the answer artifacts (append semantics) and the last state."""

    task_id: str | None = None
    artifacts: dict[str, str] = field(default_factory=new_dict)
    state: int = TaskState.TASK_STATE_SUBMITTED
    said: str = ""
    """The last status message's text (the answer of agents that reply there, or what an ask says)."""
    message: str | None = None

    def take(self, response: StreamResponse) -> list[str]:
        """Update from one response; the new text to stream."""
        kind = response.WhichOneof("payload")
        if kind == "message":
            self.message = get_message_text(response.message)
            self.state = TaskState.TASK_STATE_COMPLETED
            return [self.message]
        if kind == "task":
            return self._task(response.task)
        if kind == "status_update":
            self.task_id = response.status_update.task_id
            self._status(response.status_update.status)
            return []
        if kind == "artifact_update":
            update = response.artifact_update
            self.task_id = update.task_id
            text, key = get_artifact_text(update.artifact, ""), update.artifact.artifact_id
            if update.append:
                self.artifacts[key] = self.artifacts.get(key, "") + text
                return [text]
            before, self.artifacts[key] = self.artifacts.get(key, ""), text
            return [text.removeprefix(before)] if text.startswith(before) and text != before else []
        return []

    def _task(self, task: Task) -> list[str]:
        self.task_id = task.id
        self._status(task.status)
        for artifact in task.artifacts:
            self.artifacts[artifact.artifact_id] = get_artifact_text(artifact, "")
        return [t for t in self.artifacts.values() if t]

    def _status(self, status: Any) -> None:
        self.state = status.state
        if status.HasField("message"):
            self.said = get_message_text(status.message)

    def outcome(self, run_id: str) -> RemoteResult:
        answer = self.message or "\n".join(t for t in self.artifacts.values() if t) or self.said or None
        if self.state in _ASKING:
            return RemoteResult(run_id, None, "input_required", None, error={"message": (
                f"the remote agent needs input it cannot get from here (task {self.task_id} is "
                f"{TaskState.Name(self.state).removeprefix('TASK_STATE_').lower()}): {self.said}")})
        status = _ENDED.get(self.state)  # type: ignore[call-overload]
        if status is None:
            return _failed(run_id, f"the remote task {self.task_id} stopped while "
                           f"{TaskState.Name(self.state).removeprefix('TASK_STATE_').lower()} "  # type: ignore[arg-type]
                           "(the stream ended before the task did)")
        if status != "completed":
            return RemoteResult(run_id, answer, status, "error", error={"message": (
                f"the remote task {self.task_id} ended {status}" + (f": {self.said}" if self.said else ""))})
        return RemoteResult(run_id, answer or "", "completed", "end_turn")


def _last_user_text(messages: Sequence[Message]) -> str:
    return next((m.text for m in reversed(messages) if m.role == "user"), "")


def _failed(run_id: str, why: str) -> RemoteResult:
    return RemoteResult(run_id, None, "failed", "error", error={"message": why})


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in (401, 403):
        return f"the remote agent refused the credentials ({exc.response.status_code}): {text}"
    return f"the remote agent failed: {text}"
