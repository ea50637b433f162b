"""How a run's stream is built on the server: a new run's (`new`), a paused loop run's that goes on with its
decisions (`resumed`), what a run's tools keep their schedules in (`schedule_book`), and how a run that is not
stored waits for its people (`approver`). Every way of executing builds its streams here (`executor.py`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ringlet.agent import AgentStream
from ringlet.agent.settings import RunHost, RunSettings, overrides_json, run_options
from ringlet.context import Caller, Channel
from ringlet.gates.approval import ApprovalDecision, Approver, AutoDeny
from ringlet.loop import RunState
from ringlet.messages import Message
from ringlet.replay import recorder, resume_segment, start_segment
from ringlet.server.http.auth import Principal
from ringlet.server.runs.here import Here
from ringlet.server.runs.tracks import InProcess
from ringlet.store import Store
from ringlet.store.records import RunRecord
from ringlet.store.schedule_records import ConversationSchedules, KeyQuota

if TYPE_CHECKING:
    from ringlet.server.catalog import Catalog
    from ringlet.server.http.settings import ServerSettings


class Streams:
    """Builds the streams of this server's runs."""

    def __init__(self, store: Store, catalog: Catalog, settings: ServerSettings, here: Here) -> None:
        self.store, self.catalog, self.settings, self.here = store, catalog, settings, here

    def new(self, name: str, incoming: Sequence[Message], history: Sequence[Message], *, cid: str,
            realm: str, principal: Principal, channel: Channel, run_id: str, request_id: str | None,
            approver: Approver | None, overrides: dict[str, Any] | None, steps: Any = None,
            lineage: Any = None) -> Any:
        """The stream of a new run of agent `name` in conversation `cid`; it starts when first iterated.
        `steps`: a durable run's step executor (`ringlet.durable.DurableSteps`); `lineage`: a durable sub-agent's."""
        agent = self.catalog.get(name).agent()
        caller = Caller(conversation_id=cid, realm=realm, user_id=principal.user_id, org_id=principal.org_id,
                        roles=principal.roles, channel=channel, run_id=run_id, request_id=request_id)
        if agent.kind == "loop":  # a loop run is recorded, to be replayed (`ringlet.replay`)
            head = start_segment(incoming, (), caller)
            stored = {"before": incoming[0].id} if incoming else {"messages": len(history)}  # (read back on replay)
            steps = recorder(agent, {**head, "history": stored, "overrides": overrides_json(overrides)}, steps)
        host = RunHost(lineage=lineage, realms=principal.realms, child_host=self.here.executor.children,
                       child_approver=InProcess(self.store, self.here.waiters, name, realm, cid), steps=steps,
                       schedules=self.schedule_book(cid, name, realm, principal.org_id, principal.user_id,
                                                    principal.key_id))
        return agent.stream(incoming, history=history, caller=caller,
                            **run_options(agent, overrides or {}, RunSettings(approver=approver, host=host)))

    def resumed(self, row: RunRecord, decisions: dict[str, ApprovalDecision], *, steps: Any = None) -> AgentStream:
        """The stream that continues the paused loop run `row` with `decisions` (`steps`: a durable run's)."""
        cid, state = row.conversation_id, RunState.from_json(json.dumps(row.state))
        book = self.schedule_book(cid, row.agent, state.realm, state.org_id, state.user_id,
                                  row.key_id) if cid else None
        agent = self.catalog.get(row.agent).agent()
        steps = recorder(agent, resume_segment(decisions), steps)  # recorded, to be replayed (`ringlet.replay`)
        return agent.resume_stream(
            state, decisions, host=RunHost(schedules=book, child_host=self.here.executor.children,
                                           child_approver=InProcess(self.store, self.here.waiters, row.agent,
                                                                    state.realm, cid),
                                           steps=steps))

    def schedule_book(self, cid: str, agent: str, realm: str, org_id: str | None, user_id: str | None,
                      key_id: str | None) -> ConversationSchedules:
        """The schedules a run's tools (`alarm_clock`, `schedule_task`) keep for its conversation: made by
        its user under its key, whose limits (`max_schedules_per_key`, `min_schedule_interval_s`) hold."""
        key = None if key_id is None else KeyQuota(key_id, int(self.settings.limit("max_schedules_per_key")),
                                                   float(self.settings.limit("min_schedule_interval_s")))
        return self.store.schedules.book(cid, agent=agent, realm=realm, org_id=org_id, created_by=user_id,
                                         max_active=self.settings.scheduler_max_per_conversation, key=key)

    def approver(self, agent: str, realm: str) -> Approver:
        """How a run that is not stored waits: its requests are stored (so the approvals API finds them) and
        it waits in this process for their decisions; `approval_mode: deny` (or the agent's `v1_approvals:
        deny`: only `/v1` runs come here) denies at once instead."""
        if self.settings.approval_mode == "deny":
            return AutoDeny("system:approval_mode", "this server denies calls that need approval")
        if getattr(self.catalog.get(agent).agent(), "v1_approvals", "ask") == "deny":
            return AutoDeny("system:v1_approvals", "this agent denies calls that need approval on /v1")
        return InProcess(self.store, self.here.waiters, agent, realm)
