"""`guardrails:` in an agent's config.yaml, validated (unknown keys refused, every problem with its file
and line) and built into `Guardrails`.

    guardrails:
      stream: sentence            # or hold: the answer is sent whole, once checked
      rails:
        - type: pii               # redact e-mail, phone, card, iban, national_id, custom patterns
          kinds: [email, phone, card, iban, national_id]
          custom: {order_id: 'ORD-\\d{6}'}
        - type: prompt_injection  # on tool results
        - type: model             # a model reads the text against criteria
          model: openai:gpt-4o-mini
          criteria: The answer gives no medical dosage.
          stages: [output]
        - type: custom
          use: my_package.guards:NoShouting   # a Guardrail class or factory, given `options`
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ringlet.errors import ConfigError
from ringlet.guardrails.base import Guardrail, Stage
from ringlet.guardrails.check import Guardrails
from ringlet.guardrails.pii import PII_KINDS, PiiKind


class _Rail(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(default=None, min_length=1)
    """How events and the audit log name it (default: its type's name)."""
    stages: list[Stage] | None = Field(default=None, min_length=1)


class PiiRail(_Rail):
    type: Literal["pii"]
    kinds: list[PiiKind] = Field(default_factory=lambda: list(PII_KINDS))
    custom: dict[str, str] = Field(default_factory=dict)
    action: Literal["redact", "block"] = "redact"
    region: str = Field(default="US", pattern=r"^[A-Z]{2}$")
    replacement: str = "[{kind}]"

    @field_validator("custom")
    @classmethod
    def _patterns(cls, value: dict[str, str]) -> dict[str, str]:
        import re

        for kind, pattern in value.items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"custom pattern {kind!r} is not a regular expression: {exc}") from None
        return value


class InjectionRail(_Rail):
    type: Literal["prompt_injection"]
    threshold: float = Field(default=0.8, gt=0)
    action: Literal["block", "redact"] = "block"


class ModelRail(_Rail):
    type: Literal["model"]
    model: str = Field(min_length=1)
    criteria: str = Field(min_length=1)
    unclear: Literal["allow", "block"] = "block"


class CustomRail(_Rail):
    type: Literal["custom"]
    use: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    """`module:name` of a Guardrail class or factory."""
    options: dict[str, Any] = Field(default_factory=dict)


Rail = Annotated[PiiRail | InjectionRail | ModelRail | CustomRail, Field(discriminator="type")]


class GuardrailsConfig(BaseModel):
    """`guardrails:` of config.yaml."""

    model_config = ConfigDict(extra="forbid")
    stream: Literal["sentence", "hold"] = "sentence"
    rails: list[Rail] = Field(default_factory=list)


def build_guardrails(config: GuardrailsConfig, *, where: str = "config.yaml") -> Guardrails | None:
    """The agent's `Guardrails` (None when it has none); a problem building one names `where`."""
    if not config.rails:
        return None
    return Guardrails(tuple(_build(rail, i, where) for i, rail in enumerate(config.rails)), config.stream)


def _build(rail: PiiRail | InjectionRail | ModelRail | CustomRail, index: int, where: str) -> Guardrail:
    extra: dict[str, Any] = {}
    if rail.name is not None:
        extra["name"] = rail.name
    if rail.stages is not None:
        extra["stages"] = frozenset(rail.stages)
    try:
        if isinstance(rail, PiiRail):
            from ringlet.guardrails.pii import PiiGuardrail

            return PiiGuardrail(kinds=tuple(rail.kinds), custom=rail.custom, action=rail.action,
                                region=rail.region, replacement=rail.replacement, **extra)
        if isinstance(rail, InjectionRail):
            from ringlet.guardrails.injection import InjectionGuardrail

            return InjectionGuardrail(threshold=rail.threshold, action=rail.action, **extra)
        if isinstance(rail, ModelRail):
            from ringlet.guardrails.graded import ModelGuardrail

            return ModelGuardrail(rail.model, rail.criteria, unclear=rail.unclear, **extra)
        return _custom(rail, extra)
    except ConfigError as exc:
        raise ConfigError(f"{where}: guardrails.rails.{index}: {exc}") from None


def _custom(rail: CustomRail, extra: dict[str, Any]) -> Guardrail:
    module, _, attr = rail.use.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load {rail.use!r}: {exc}") from None
    made = factory(**rail.options)
    for key, value in extra.items():
        setattr(made, key, value)
    if not isinstance(made, Guardrail):
        raise ConfigError(f"{rail.use!r} made {type(made).__name__}, not a guardrail (it needs `name`, "
                          "`stages` and `async def check(text, at)`)")
    return made
