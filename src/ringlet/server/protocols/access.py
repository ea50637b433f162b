"""What a key may reach: the conversations it may see (`conversation_for`: anything else is 404, exactly as an
unknown id, so a key cannot learn what exists outside its realms and agents), the runs it may see
(`visible_run`, alike) and the conversations a client names by ids of its own (`named_conversation`: AG-UI
threadIds, A2A contextIds, scoped to realm and agent)."""

from __future__ import annotations

from fastapi import Request
from sqlalchemy.exc import IntegrityError

from ringlet._ids import derived_id
from ringlet.server.catalog import Hosted
from ringlet.server.http.auth import Principal
from ringlet.server.http.errors import ApiError
from ringlet.server.runs.service import Runs, runs_of
from ringlet.store.records import Conversation, RunRecord


async def conversation_for(request: Request, cid: str, principal: Principal) -> Conversation:
    """The conversation, when the key may see it (its realm and agent); else 404, the same answer as for an
    unknown id, so a key cannot learn what exists outside its realms."""
    conversation = await runs_of(request).records.conversations.get(cid)
    if conversation is None or not principal.sees(conversation.realm) or \
            not principal.may_use(conversation.agent):
        raise ApiError(404, "conversation_not_found", f"no conversation {cid!r}")
    return conversation


async def visible_run(runs: Runs, run_id: str, principal: Principal) -> RunRecord:
    """The run's record, when the key may see it (its conversation's realm, its agent); else 404, the same
    answer as for an unknown id."""
    record = await runs.records.runs.get(run_id)
    realm = record.realm if record else None
    if record and record.conversation_id:
        conversation = await runs.records.conversations.get(record.conversation_id)
        realm = conversation.realm if conversation else None
    if record is None or realm is None or not principal.sees(realm) or not principal.may_use(record.agent):
        raise ApiError(404, "run_not_found", f"no run {run_id!r}")  # nor one this key may see
    return record


async def named_conversation(runs: Runs, principal: Principal, hosted: Hosted, name: str, *,
                             create: bool = True) -> Conversation | None:
    """The conversation of `hosted` a client names by an id of its own choosing (an AG-UI threadId, an A2A
    contextId), made on first use. A conversation the key may see under that id (one the server gave out) is
    taken as it is. Otherwise the name stands, in the realm the agent runs in for this key, for the
    conversation whose id is derived from realm, agent and name: the same name in another realm is another
    conversation, so a name neither reveals nor blocks what another realm or agent holds. Without `create`:
    None for a name that stands for nothing yet."""
    store = runs.records
    given = await store.conversations.get(name)
    if given is not None and principal.sees(given.realm) and principal.may_use(given.agent):
        if given.agent != hosted.name:
            raise ApiError(400, "invalid_request", f"conversation {name} belongs to agent {given.agent!r}, not "
                           f"{hosted.name!r}; name a new one for this agent")
        return given
    realm = hosted.realm_for(principal)
    cid = derived_id("c", f"{realm}\x00{hosted.name}\x00{name}")
    if (found := await store.conversations.get(cid)) is not None or not create:
        return found
    try:
        return await store.conversations.create(agent=hosted.name, realm=realm, org_id=principal.org_id,
                                               user_id=principal.user_id, conversation_id=cid, client_id=name)
    except IntegrityError:  # made by a request at the same time, or a deleted conversation's
        if (found := await store.conversations.get(cid)) is None:
            raise ApiError(404, "conversation_not_found", f"no conversation {name!r} (it was deleted); name a new "
                           "one") from None
        return found


def client_id(conversation: Conversation) -> str:
    """The id a conversation's client knows it by: the one it named it with, else its own."""
    return conversation.client_id or conversation.id
