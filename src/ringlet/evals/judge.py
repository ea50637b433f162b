"""`LLMJudge`: a model grades the output against a rubric. Its model is any ringlet model (`provider:name`
or a `Model`); none named: the judge model the evaluation was given (`--judge-model`), else the model of
the agent under evaluation. Its fields are pydantic-evals': `rubric`, `model`, `include_input`,
`include_expected_output`, `assertion` and `score` (each true/false, or `{evaluation_name, include_reason}`).
The judge's own usage counts in the case's cost (`EvaluatorContext.usage` is the run's only)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from ringlet.evals.evaluators import EvaluationReason, Evaluator, EvaluatorContext

__all__ = ["Grade", "LLMJudge"]

INSTRUCTIONS = """You grade the output of an AI agent against a rubric. Read the rubric, the output and
anything else given, then answer with: `reason` (one or two sentences on why), `pass` (true when the output
meets the rubric) and `score` (0.0 to 1.0, how well it meets it)."""


class Grade(BaseModel):
    """What the judge answers."""

    reason: str
    pass_: bool = Field(alias="pass")
    score: float = Field(ge=0, le=1)


@dataclass(slots=True)
class LLMJudge(Evaluator):
    """A model judges the output against `rubric`: an assertion (`pass`), and with `score` a 0–1 score."""

    rubric: str = ""
    model: str | None = None
    include_input: bool = False
    include_expected_output: bool = False
    assertion: bool | dict[str, Any] = True
    score: bool | dict[str, Any] = False
    model_settings: dict[str, Any] | None = None
    evaluation_name: str | None = None
    judge: Any = field(default=None, repr=False, compare=False)
    """Set by the runner: the model used when `model` names none."""

    async def evaluate(self, ctx: EvaluatorContext) -> Any:
        from ringlet.agent import Agent

        model = self.model or self.judge
        if model is None:
            raise ValueError("LLMJudge has no model: name one (model: provider:name) or pass --judge-model")
        from ringlet.models.base import ModelSettings

        settings = ModelSettings(**self.model_settings) if self.model_settings else None
        agent = Agent(model, instructions=INSTRUCTIONS, output_type=Grade, name="judge", model_settings=settings)
        try:
            result = await agent.run(self._prompt(ctx))
        finally:
            await agent.aclose()
        ctx.spent.append(result.usage)
        grade = result.output
        if grade is None:
            raise ValueError(f"the judge gave no grade: {(result.error or {}).get('message', 'no answer')}")
        out: dict[str, EvaluationReason] = {}
        base = self.evaluation_name or "LLMJudge"
        for kind, config, value in (("pass", self.assertion, grade.pass_), ("score", self.score, grade.score)):
            if config is False:
                continue
            options = config if isinstance(config, dict) else {}
            name = options.get("evaluation_name") or (base if kind == "pass" else f"{base}_score")
            out[name] = EvaluationReason(value, grade.reason if options.get("include_reason", True) else None)
        return out

    def _prompt(self, ctx: EvaluatorContext) -> str:
        parts = [f"<rubric>\n{self.rubric}\n</rubric>", f"<output>\n{_text(ctx.output)}\n</output>"]
        if self.include_input:
            parts.insert(0, f"<input>\n{_text(ctx.inputs)}\n</input>")
        if self.include_expected_output and ctx.expected_output is not None:
            parts.append(f"<expected_output>\n{_text(ctx.expected_output)}\n</expected_output>")
        return "\n".join(parts)

    def spec(self) -> Any:
        data = {"rubric": self.rubric}
        for name, default in (("model", None), ("include_input", False), ("include_expected_output", False),
                              ("assertion", True), ("score", False), ("model_settings", None),
                              ("evaluation_name", None)):
            if (value := getattr(self, name)) != default:
                data[name] = value
        return {"LLMJudge": data if len(data) > 1 else self.rubric}


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    dump = getattr(value, "model_dump", None)
    return json.dumps(dump(mode="json") if callable(dump) else value, ensure_ascii=False, default=str)
