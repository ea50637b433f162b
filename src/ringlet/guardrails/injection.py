"""Prompt injection in tool results: text that speaks to the model instead of informing it.

Web pages, files and MCP servers return text the model reads; an injection in it tries to give the model
new orders ("ignore your instructions", a fake system turn, a message "to the AI reading this"). This
detector scores such signals, each a pattern with a weight; a text scoring `threshold` or more is an
injection. It is a first line, cheap (no model), and tuned on `bench/guardrails_dev.yaml`; pair it with a
`ModelGuardrail` where a miss costs much.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ringlet.guardrails.base import ALLOW, Block, Checked, Redact, Span, Stage, Verdict

_I = re.IGNORECASE
_PRIOR = (r"(?:all\s+|any\s+|the\s+|your\s+|my\s+|these\s+|those\s+)*"
          r"(?:previous|prior|above|earlier|preceding|original|initial|former|existing|current)")
_ORDERS = (r"(?:instructions?|directions?|directives?|prompts?|rules|guidelines|orders|commands|context|"
           r"constraints|programming|guardrails)")
_AI = r"(?:ai|a\.i\.|llm|language\s+model|assistant|chat\s*bot|chatbot|agent|gpt|claude|model)"

SIGNALS: tuple[tuple[str, re.Pattern[str], float], ...] = (
    ("override", re.compile(rf"\b(?:ignore|disregard|forget|override|bypass|skip|drop|abandon)\b[^.\n]{{0,30}}?"
                            rf"{_PRIOR}\s+(?:\w+\s+)?{_ORDERS}", _I), 1.0),
    ("override", re.compile(r"\b(?:ignore|disregard|forget)\s+(?:everything|all)\s+(?:(?:you\s+(?:were|have\s+been)"
                            r"\s+told)|above|before|else)", _I), 1.0),
    ("override", re.compile(r"\b(?:disregard|ignore|violate)\s+(?:\w+\s+){0,2}(?:safety|security|content)\s+"
                            r"(?:rules|guidelines|polic(?:y|ies)|filters?)", _I), 1.0),
    ("new_orders", re.compile(r"\b(?:new|updated|real|actual|true|hidden|secret)\s+(?:instructions?|task|"
                              r"objective|goal|orders|directive)s?\b\s*(?:from|for|:|is|are)", _I), 0.7),
    ("role_play", re.compile(r"\byou\s+(?:are\s+now|must\s+now\s+act|will\s+now\s+act|now\s+act)\b|\bact\s+as\s+"
                             r"(?:dan|an?\s+(?:ai|assistant)\s+(?:without|with\s+no))|\b(?:developer|god|jailbreak|"
                             r"dan|unrestricted)\s+mode\b", _I), 1.0),
    ("fake_turn", re.compile(r"(?:^|[\n>\]\.]\s*)(?:system|assistant|developer)\s*:\s|<\s*/?\s*(?:system|"
                             r"im_start|im_end|tool_result|instructions?)\s*>|\[/?(?:INST|SYS)\]|<<\s*SYS\s*>>|"
                             r"<\|(?:im_start|system|endoftext)\|>", _I), 0.8),
    ("addressed", re.compile(rf"\b(?:if\s+you\s+are\s+(?:an?\s+)?{_AI}|(?:note|message|instructions?)\s+(?:to|for)\s+"
                             rf"(?:the\s+|any\s+|all\s+)?{_AI}s?|(?:dear\s+|hey\s+|attention\s*,?\s+)?{_AI}s?\s*"
                             rf"(?:reading|processing|summari[sz]ing|browsing)\s+this)\b", _I), 0.8),
    ("addressed", re.compile(rf"(?:^|[.!?:\n]\s*)(?:the\s+)?(?:{_AI}\s+)?{_AI}\s*[,:]\s*"
                             r"(?:please\s+|you\s+must\s+|now\s+)?"
                             rf"(?:ignore|forget|disregard|call|run|send|email|transfer|reveal|print|output|do)\b",
                             _I), 0.9),
    ("addressed", re.compile(rf"\bthe\s+{_AI}\s+(?:must|should|shall|is\s+required\s+to)\b", _I), 0.5),
    ("exfiltrate", re.compile(r"\b(?:reveal|print|output|repeat|show|leak|send|email|forward|post)\b[^.\n]{0,40}?"
                              r"\b(?:system\s+prompt|(?:hidden|initial|secret)\s+(?:instructions?|prompt)|"
                              r"conversation\s+history|chat\s+history|api\s+keys?|passwords?|credentials|"
                              r"secrets?|\.ssh|id_rsa|\.env\b)", _I), 0.9),
    ("hijack", re.compile(r"\b(?:do\s+not|don'?t|never)\s+(?:follow|obey|answer|tell|mention|reveal\s+to)\s+"
                          r"(?:the\s+)?(?:user|these\s+instructions|this\s+(?:instruction|message))", _I), 0.8),
    ("hijack", re.compile(r"\binstead\s*,?\s+(?:output|say|respond|reply|answer|print|recommend|tell)\b", _I), 0.5),
    ("tool_push", re.compile(r"\b(?:call|invoke|use|run|execute)\s+(?:the\s+|its\s+|your\s+)?[`'\"]?[a-z_]+[`'\"]?"
                             r"\s+(?:tool|function|command)\b[^.\n]{0,30}\b(?:now|immediately|first|before)\b|"
                             r"curl\s+\S+\s*\|\s*(?:ba)?sh", _I), 0.6),
    ("hidden", re.compile(r"<!--[^>]{0,400}?\b(?:ai|assistant|llm|model|instructions?|ignore|disregard)\b", _I), 0.5),
)


@dataclass(frozen=True, slots=True)
class Found:
    score: float
    signals: tuple[str, ...]


def injection_score(text: str) -> Found:
    """The summed weight of the signals found in `text` (each signal counted once) and their names."""
    hits: dict[str, float] = {}
    for name, pattern, weight in SIGNALS:
        if pattern.search(text):
            hits[name] = max(hits.get(name, 0.0), weight)
    return Found(round(sum(hits.values()), 3), tuple(hits))


@dataclass(slots=True)
class InjectionGuardrail:
    """Blocks (or, `action="redact"`, replaces with a notice) a tool result that tries to give the model
    orders. `threshold`: the score from which a text is an injection (a strong signal weighs 1)."""

    threshold: float = 0.8
    action: Literal["block", "redact"] = "block"
    stages: frozenset[Stage] = frozenset({"tool_result"})
    name: str = "prompt_injection"

    async def check(self, text: str, at: Checked) -> Verdict:
        return self.decide(text)

    def decide(self, text: str) -> Verdict:
        found = injection_score(text)
        if found.score < self.threshold:
            return ALLOW
        if self.action == "redact":
            notice = f"[withheld: this text tried to give the assistant orders ({', '.join(found.signals)})]"
            return Redact(spans=(Span(0, len(text), "injection", notice),))
        return Block(reason=f"a tool result looks like a prompt injection ({', '.join(found.signals)})",
                     kinds=("injection",))
