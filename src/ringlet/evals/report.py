"""What an evaluation found: per case, per run, per evaluator; JSON (`--json`), JUnit XML (`--junit`) and the
comparison with an earlier report (`--baseline`).

A result is an assertion when its value is a bool (False fails the run), a score when it is a number, a
label when it is a text; an evaluator that raised is a failed assertion with its error as the reason. A run
passes when it ended and every assertion holds; a case passes when every run of it (`--repeat`) passes.
A comparison counts as a regression a case whose pass rate fell, or an assertion that holds less often;
scores, cost and duration that got worse are shown, not counted (they are noisy).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from pydantic import BaseModel, Field

__all__ = ["CaseReport", "CaseRun", "Change", "Comparison", "Report", "Result", "compare"]


class Result(BaseModel):
    """One evaluator's verdict on one run."""

    name: str
    evaluator: str
    value: bool | int | float | str | None = None
    reason: str | None = None
    error: str | None = None

    @property
    def is_assertion(self) -> bool:
        return isinstance(self.value, bool) or self.error is not None

    @property
    def passed(self) -> bool:
        return self.error is None and self.value is not False


class CaseRun(BaseModel):
    """One run of a case and how it was judged."""

    attempt: int = 1
    run_id: str | None = None
    output: Any = None
    status: str = "completed"
    error: dict[str, Any] | None = None
    results: list[Result] = Field(default_factory=list)
    duration_s: float = 0.0
    usage: dict[str, Any] = Field(default_factory=dict)
    judge_cost_usd: float | None = None
    events: int = 0
    """How many events the run streamed."""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    """The run's transcript (its input and what it added), as ringlet stores messages."""

    @property
    def passed(self) -> bool:
        return self.error is None and self.status == "completed" and all(r.passed for r in self.results)

    @property
    def reasons(self) -> list[str]:
        out = [f"run {self.status}: {self.error.get('message', self.error)}"] if self.error else []
        return out + [f"{r.name}: {r.error or r.reason or 'failed'}" for r in self.results if not r.passed]


class CaseReport(BaseModel):
    """A case: what it asked, and its runs."""

    name: str
    inputs: Any = None
    expected_output: Any = None
    metadata: Any = None
    line: int | None = None
    runs: list[CaseRun] = Field(default_factory=list)

    @property
    def pass_rate(self) -> float:
        return sum(r.passed for r in self.runs) / len(self.runs) if self.runs else 0.0

    @property
    def passed(self) -> bool:
        return bool(self.runs) and all(r.passed for r in self.runs)

    @property
    def duration_s(self) -> float:
        return statistics.median(r.duration_s for r in self.runs) if self.runs else 0.0

    @property
    def cost_usd(self) -> float | None:
        costs = [r.usage.get("cost_usd") for r in self.runs]
        return None if not costs or None in costs else statistics.fmean(c for c in costs if c is not None)

    @property
    def tokens(self) -> float:
        return statistics.fmean(int(r.usage.get("in_tokens") or 0) + int(r.usage.get("out_tokens") or 0)
                                for r in self.runs) if self.runs else 0.0

    def assertion_rates(self) -> dict[str, float]:
        """Per assertion: the share of runs in which it held."""
        seen: dict[str, list[bool]] = {}
        for run in self.runs:
            for result in run.results:
                if result.is_assertion:
                    seen.setdefault(result.name, []).append(result.passed)
        return {name: sum(v) / len(v) for name, v in seen.items()}

    def scores(self) -> dict[str, float]:
        seen: dict[str, list[float]] = {}
        for run in self.runs:
            for r in run.results:
                if isinstance(r.value, int | float) and not isinstance(r.value, bool) and r.error is None:
                    seen.setdefault(r.name, []).append(float(r.value))
        return {name: statistics.fmean(v) for name, v in seen.items()}


class Report(BaseModel):
    """An evaluation of one agent on one dataset."""

    dataset: str | None = None
    path: str | None = None
    agent: str = ""
    model: str | None = None
    started_at: str = ""
    duration_s: float = 0.0
    repeat: int = 1
    concurrency: int = 1
    cases: list[CaseReport] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases)

    @property
    def failed(self) -> list[CaseReport]:
        return [c for c in self.cases if not c.passed]

    def summary(self) -> dict[str, Any]:
        runs = [r for c in self.cases for r in c.runs]
        costs = [r.usage.get("cost_usd") for r in runs]
        return {"cases": len(self.cases), "passed": len(self.cases) - len(self.failed), "failed": len(self.failed),
                "runs": len(runs), "pass_rate": sum(r.passed for r in runs) / len(runs) if runs else 0.0,
                "duration_s": round(self.duration_s, 3),
                "median_case_s": round(statistics.median(r.duration_s for r in runs), 4) if runs else 0.0,
                "in_tokens": sum(int(r.usage.get("in_tokens") or 0) for r in runs),
                "out_tokens": sum(int(r.usage.get("out_tokens") or 0) for r in runs),
                "cost_usd": None if None in costs else round(sum(c for c in costs if c is not None), 6),
                "judge_cost_usd": round(sum(r.judge_cost_usd or 0 for r in runs), 6)}

    def to_json(self) -> str:
        data = self.model_dump(mode="json")
        data["summary"] = self.summary()
        for case, dumped in zip(self.cases, data["cases"], strict=True):
            dumped["pass_rate"], dumped["passed"] = case.pass_rate, case.passed
            for run, run_dumped in zip(case.runs, dumped["runs"], strict=True):
                run_dumped["passed"] = run.passed
        import json

        return json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n"

    def write_json(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def from_file(cls, path: str | Path) -> Report:
        """Read a report `--json` wrote (derived fields are recomputed)."""
        from ringlet.evals.case import DatasetError

        try:
            return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise DatasetError(f"{path}: cannot read the report ({exc})") from None
        except ValueError as exc:
            raise DatasetError(f"{path}: not a report written by `ringlet eval --json` ({str(exc)[:200]})") from None

    def to_junit(self) -> str:
        """JUnit XML: one testcase per case, a failure (with every reason) for each failed one."""
        suite = ET.Element("testsuite", name=self.dataset or self.agent or "ringlet-eval",
                           tests=str(len(self.cases)), failures=str(len(self.failed)), errors="0",
                           time=f"{self.duration_s:.3f}", timestamp=self.started_at)
        for case in self.cases:
            element = ET.SubElement(suite, "testcase", classname=f"{self.agent}.{self.dataset or 'dataset'}",
                                    name=case.name, time=f"{sum(r.duration_s for r in case.runs):.3f}")
            if not case.passed:
                reasons = [f"run {r.attempt}: {why}" for r in case.runs for why in r.reasons]
                failure = ET.SubElement(element, "failure", message=(reasons or ["failed"])[0][:500],
                                        type="EvalFailure")
                failure.text = "\n".join(reasons)
            out = ET.SubElement(element, "system-out")
            out.text = "\n".join(f"run {r.attempt}: {r.output!r}"[:2000] for r in case.runs)
        ET.indent(suite)
        return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"

    def write_junit(self, path: str | Path) -> None:
        Path(path).write_text(self.to_junit(), encoding="utf-8")


class Change(BaseModel):
    """One thing that differs from the baseline."""

    case: str
    what: str
    """`pass_rate`, an assertion's or score's name, `cost_usd`, `duration_s`, `new`, `removed`."""
    before: float | None = None
    after: float | None = None
    regression: bool = False

    @property
    def better(self) -> bool:
        if self.before is None or self.after is None:
            return False
        lower_is_better = self.what in ("cost_usd", "duration_s")
        return self.after < self.before if lower_is_better else self.after > self.before


class Comparison(BaseModel):
    changes: list[Change] = Field(default_factory=list)

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]

    @property
    def improvements(self) -> list[Change]:
        return [c for c in self.changes if c.better and c.what not in ("cost_usd", "duration_s")]


SLOWER = 1.5
"""Cost or duration is shown as changed past this factor (either way) and `FLOOR`: smaller changes are noise."""
FLOOR = {"cost_usd": 1e-6, "duration_s": 0.05}


def compare(report: Report, baseline: Report) -> Comparison:
    """What got better and worse against `baseline`, per case and per evaluator."""
    before = {c.name: c for c in baseline.cases}
    changes: list[Change] = []
    for case in report.cases:
        old = before.pop(case.name, None)
        if old is None:
            changes.append(Change(case=case.name, what="new", after=case.pass_rate))
            continue
        if case.pass_rate != old.pass_rate:
            changes.append(Change(case=case.name, what="pass_rate", before=old.pass_rate, after=case.pass_rate,
                                  regression=case.pass_rate < old.pass_rate))
        was, now = old.assertion_rates(), case.assertion_rates()
        changes.extend(Change(case=case.name, what=name, before=was[name], after=now[name],
                              regression=now[name] < was[name])
                       for name in sorted(set(was) & set(now)) if now[name] != was[name])
        was_s, now_s = old.scores(), case.scores()
        changes.extend(Change(case=case.name, what=name, before=was_s[name], after=now_s[name])
                       for name in sorted(set(was_s) & set(now_s)) if abs(now_s[name] - was_s[name]) > 1e-9)
        for what, a, b in (("cost_usd", old.cost_usd, case.cost_usd), ("duration_s", old.duration_s, case.duration_s)):
            if a and b and (b > a * SLOWER or b * SLOWER < a) and abs(b - a) >= FLOOR[what]:
                changes.append(Change(case=case.name, what=what, before=a, after=b))
    changes.extend(Change(case=name, what="removed", before=old.pass_rate) for name, old in before.items())
    return Comparison(changes=changes)
