"""A durable run's workflow input: what a worker needs to start a stored run (JSON), stored with the run's
record (`Starter.start`) and enqueued (`engine.Engine.dispatch`, or `requeue` by recovery). Apart from the
engine, so that starting a run needs nothing of DBOS."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ringlet.agent.settings import overrides_json
from ringlet.messages import Message
from ringlet.server.runs.active import ActiveRun


def spec_of(run: ActiveRun, realm: str, incoming: Sequence[Message], *, principal: Any,
            channel: str, overrides: dict[str, Any] | None, request_id: str | None, deny: bool,
            kind: str = "loop") -> dict[str, Any]:
    """A run's workflow input: what a worker needs to start it (JSON)."""
    given = overrides_json(overrides)
    return {"run_id": run.run_id, "conversation_id": run.conversation_id, "agent": run.agent,
            "kind": kind,
            "realm": realm, "channel": channel,
            "incoming": [m.model_dump(mode="json") for m in incoming], "overrides": given,
            "principal": {"key_id": principal.key_id, "user_id": principal.user_id, "org_id": principal.org_id,
                          "roles": list(principal.roles),
                          "realms": None if principal.realms is None else sorted(principal.realms)},
            "request_id": request_id, "deny": deny}
