"""Content guardrails: checks of what a run's texts say, at four stages (a user's message, the answer, a
tool call's arguments, a tool's result), each deciding `Allow`, `Redact(spans)` or `Block(reason)`.

Built in: `PiiGuardrail` (e-mail, phone, card, IBAN, national id, custom patterns), `InjectionGuardrail`
(prompt injection in tool results) and `ModelGuardrail` (any ringlet model judges against criteria, its
cost reported). Write your own with the `Guardrail` protocol. Give them to an agent with
`Gates(guardrails=Guardrails((...)))`, or `guardrails:` in its config.yaml.
"""

from ringlet.guardrails.base import ALLOW, STAGES, Allow, Block, Checked, Guardrail, Redact, Span, Stage, Verdict
from ringlet.guardrails.check import GuardrailBlocked, Guardrails, GuardRun, OutputGate
from ringlet.guardrails.graded import ModelGuardrail
from ringlet.guardrails.injection import InjectionGuardrail, injection_score
from ringlet.guardrails.pii import PII_KINDS, PiiGuardrail, find_pii

__all__ = [
    "ALLOW",
    "PII_KINDS",
    "STAGES",
    "Allow",
    "Block",
    "Checked",
    "GuardRun",
    "Guardrail",
    "GuardrailBlocked",
    "Guardrails",
    "InjectionGuardrail",
    "ModelGuardrail",
    "OutputGate",
    "PiiGuardrail",
    "Redact",
    "Span",
    "Stage",
    "Verdict",
    "find_pii",
    "injection_score",
]
