"""The bodies of the triggers API (`triggers.py`): webhook and cron triggers, and a fire. As pydantic models,
they validate requests and give `/openapi.json` its schemas."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from ringlet.server.http.schemas import Body, View, omittable


class NewTrigger(Body):
    model_config = ConfigDict(json_schema_extra={"allOf": [  # checked in the route: 422 otherwise
        {"if": {"properties": {"kind": {"const": "cron"}}},
         "then": {"required": ["cron"], "properties": {"cron": {"type": "string"}}}},
        {"if": {"properties": {"kind": {"const": "webhook"}}},
         "then": {"properties": {"cron": {"type": ["string", "null"], "maxLength": 0}}}}]})

    name: str = Field(min_length=1, max_length=200)
    agent: str = Field(min_length=1)
    kind: Literal["webhook", "cron"]
    cron: str | None = None
    timezone: str = "UTC"
    message_template: str | None = Field(default=None, max_length=20_000)
    conversation_id: str | None = None
    realm: str | None = None
    secret: str | None = Field(default=None, min_length=16, max_length=200)
    enabled: bool = True


class TriggerChanges(Body):
    """The fields to change; null clears `message_template`, `conversation_id` and `secret`."""

    name: str = omittable(min_length=1, max_length=200)
    cron: str = omittable()
    timezone: str = omittable()
    message_template: str | None = Field(default=None, max_length=20_000)
    conversation_id: str | None = None
    secret: str | None = Field(default=None, min_length=16, max_length=200)
    enabled: bool = omittable()


class Trigger(View):
    id: str
    name: str
    agent: str
    kind: Literal["webhook", "cron"]
    cron: str | None
    timezone: str
    message_template: str | None
    conversation_id: str | None
    realm: str
    has_secret: bool
    enabled: bool
    next_fire_at: str | None
    last_fired_at: str | None
    created_at: str
    updated_at: str


class TriggerList(View):
    data: list[Trigger]


class Fired(View):
    run_id: str
    conversation_id: str | None
    """None only while a concurrent delivery with the same Idempotency-Key is still starting the run."""
