"""Evals: measure an agent's quality on a dataset of cases, compare two versions, fail CI on a regression.

    from ringlet.evals import Dataset

    dataset = Dataset.from_file("examples/evals/weather.yaml")   # pydantic-evals' file format
    report = await dataset.evaluate(agent, concurrency=4)
    report.write_json("report.json")
    assert report.passed, [c.name for c in report.failed]

    dataset.py     cases and datasets: read, validated (file:line on every problem) and written
    evaluators.py  the standard evaluators and ringlet's own over the run (tool calls, errors, rounds, cost, gates)
    judge.py       LLMJudge: a ringlet model grades the output against a rubric
    runner.py      runs each case through the agent's stream and judges it
    report.py      the report: JSON, JUnit XML, and the comparison with a baseline
    capture.py     a stored conversation as a case
"""

from ringlet.evals.dataset import Case, Dataset, DatasetError
from ringlet.evals.evaluators import (
    Contains,
    Equals,
    EqualsExpected,
    EvaluationReason,
    Evaluator,
    EvaluatorContext,
    GuardrailDecision,
    IsInstance,
    MaxCost,
    MaxDuration,
    MaxRounds,
    MaxTokens,
    NoError,
    OutputMatches,
    PolicyDecision,
    ToolCalled,
    ToolNotCalled,
)
from ringlet.evals.judge import LLMJudge
from ringlet.evals.report import CaseReport, CaseRun, Change, Comparison, Report, Result, compare

__all__ = [
    "Case", "CaseReport", "CaseRun", "Change", "Comparison", "Contains", "Dataset", "DatasetError", "Equals",
    "EqualsExpected", "EvaluationReason", "Evaluator", "EvaluatorContext", "GuardrailDecision", "IsInstance",
    "LLMJudge", "MaxCost", "MaxDuration", "MaxRounds", "MaxTokens", "NoError", "OutputMatches", "PolicyDecision",
    "Report", "Result", "ToolCalled", "ToolNotCalled", "compare",
]
