"""Datasets of cases, read from and written to pydantic-evals' files (YAML or JSON).

    name: weather                     # optional
    evaluators:                       # for every case
      - NoError
      - ToolCalled: get_weather       # the evaluator's first field
    cases:
      - name: paris
        inputs: What is the weather in Paris?       # a prompt, or {prompt, history, deps, model}
        expected_output: sunny
        metadata: {difficulty: easy}
        evaluators:
          - Contains: {value: Sunny, case_sensitive: false}

A case's `inputs` is a prompt string, or a mapping with `prompt` and optionally `history` (messages:
`{role, content}` or ringlet's stored form), `deps` (the tools' `ctx.deps`) and `model` (this case runs on
it). Any other mapping (a pydantic-evals task's typed input) is sent to the agent as its JSON text. An
evaluator is named by class: the standard and ringlet's own (`evaluators.NAMES`, `LLMJudge`), those passed
as `custom_evaluator_types`, or `module:Class` (imported; the dataset's folder is importable). Every
problem is a `DatasetError` naming the file, the line and the fix; `$schema` and `report_evaluators` are
accepted and not used.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ringlet.evals.case import Case, DatasetError, message_of
from ringlet.evals.evaluators import NAMES, Evaluator
from ringlet.evals.judge import LLMJudge

if TYPE_CHECKING:
    from ringlet.evals.report import Report
    from ringlet.evals.runner import Progress

__all__ = ["Case", "Dataset", "DatasetError"]

INPUT_KEYS = frozenset({"prompt", "history", "deps", "model"})
CASE_KEYS = frozenset({"name", "inputs", "expected_output", "metadata", "evaluators"})
TOP_KEYS = frozenset({"name", "cases", "evaluators", "report_evaluators", "$schema"})


@dataclass(slots=True)
class Dataset:
    """Cases and the evaluators every case is judged by."""

    cases: list[Case]
    evaluators: list[Evaluator] = field(default_factory=list)
    name: str | None = None
    path: Path | None = None

    @classmethod
    def from_file(cls, path: str | Path, *, custom_evaluator_types: Iterable[type] = ()) -> Dataset:
        """Read a YAML (`.yaml`, `.yml`) or JSON (`.json`) dataset file."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DatasetError(f"{path}: cannot read the dataset ({exc})") from None
        return cls.from_text(text, path=path, custom_evaluator_types=custom_evaluator_types)

    @classmethod
    def from_text(cls, text: str, *, path: Path | None = None, custom_evaluator_types: Iterable[type] = ()) -> Dataset:
        where = str(path or "<dataset>")
        data, node = _parse(text, where, json_only=path is not None and path.suffix == ".json")
        types = {**NAMES, "LLMJudge": LLMJudge, **{t.__name__: t for t in custom_evaluator_types}}
        reader = _Reader(where, types, path.parent if path else Path.cwd())
        return reader.dataset(data, node, path)

    def to_file(self, path: str | Path) -> None:
        """Write the dataset as pydantic-evals does: YAML for `.yaml`/`.yml`, else JSON."""
        path = Path(path)
        data = self.to_dict()
        if path.suffix in (".yaml", ".yml"):
            text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        else:
            text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
        path.write_text(text, encoding="utf-8")

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name} if self.name else {}
        data["cases"] = [_case_dict(c) for c in self.cases]
        data["evaluators"] = [_spec(e) for e in self.evaluators]
        return data

    async def evaluate(self, agent: Any, *, concurrency: int = 4, repeat: int = 1, model: Any = None,
                       judge_model: Any = None, progress: Progress | None = None) -> Report:
        """Run every case (`repeat` times each, at most `concurrency` at once) on `agent` (an `Agent`, a
        graph agent, or any object with `stream(prompt, **options)`), judge each run; the report."""
        from ringlet.evals.runner import evaluate

        return await evaluate(self, agent, concurrency=concurrency, repeat=repeat, model=model,
                              judge_model=judge_model, progress=progress)


def _case_dict(case: Case) -> dict[str, Any]:
    data: dict[str, Any] = {"name": case.name, "inputs": case.inputs}
    if case.metadata is not None:
        data["metadata"] = case.metadata
    if case.expected_output is not None:
        data["expected_output"] = case.expected_output
    if case.evaluators:
        data["evaluators"] = [_spec(e) for e in case.evaluators]
    return data


def _spec(evaluator: Any) -> Any:
    spec = getattr(evaluator, "spec", None)
    if callable(spec):
        return spec()
    values = {f.name: getattr(evaluator, f.name) for f in dataclasses.fields(evaluator)} \
        if dataclasses.is_dataclass(evaluator) else {}
    name = type(evaluator).__name__
    return {name: values} if values else name


def _parse(text: str, where: str, *, json_only: bool) -> tuple[Any, Any]:
    """The file's data and its YAML node tree (for line numbers; None for JSON YAML cannot read)."""
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        if not json_only:
            mark = getattr(exc, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            raise DatasetError(f"{where}{line}: not valid YAML ({getattr(exc, 'problem', exc)}); fix the "
                               "syntax there") from None
        try:
            return json.loads(text), None
        except json.JSONDecodeError as err:
            raise DatasetError(f"{where}:{err.lineno}: not valid JSON ({err.msg}); fix the syntax there") from None
    return data, node


class _Reader:
    """Builds a Dataset from parsed data, naming file:line on every problem."""

    def __init__(self, where: str, types: Mapping[str, type], folder: Path) -> None:
        self.where, self.types, self.folder = where, types, folder

    def fail(self, node: Any, message: str) -> DatasetError:
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        return DatasetError(f"{self.where}{line}: {message}")

    def dataset(self, data: Any, node: Any, path: Path | None) -> Dataset:
        if not isinstance(data, Mapping):
            raise self.fail(node, "a dataset is a mapping with `cases` (and optionally `evaluators`)")
        if unknown := set(data) - TOP_KEYS:
            raise self.fail(node, f"unknown key(s) {sorted(unknown)}; a dataset has {sorted(TOP_KEYS)}")
        cases_data, cases_node = data.get("cases"), _child(node, "cases")
        if not isinstance(cases_data, list) or not cases_data:
            raise self.fail(cases_node or node, "`cases` must be a non-empty list of cases")
        evaluators = self.evaluators(data.get("evaluators"), _child(node, "evaluators"), "evaluators")
        cases, seen = [], set()
        for i, case in enumerate(cases_data):
            built = self.case(case, _item(cases_node, i), i)
            if built.name in seen:
                raise self.fail(_item(cases_node, i), f"cases[{i}]: the name {built.name!r} is used twice; "
                                "case names are unique")
            seen.add(built.name)
            cases.append(built)
        name = data.get("name")
        return Dataset(cases, evaluators, str(name) if name is not None else None, path)

    def case(self, data: Any, node: Any, i: int) -> Case:
        at = f"cases[{i}]"
        if not isinstance(data, Mapping):
            raise self.fail(node, f"{at}: a case is a mapping with `inputs` (and `name`, `expected_output`, …)")
        if unknown := set(data) - CASE_KEYS:
            raise self.fail(node, f"{at}: unknown key(s) {sorted(unknown)}; a case has {sorted(CASE_KEYS)}")
        if "inputs" not in data:
            raise self.fail(node, f"{at}: `inputs` is missing; write the prompt there (inputs: What is 2+2?)")
        inputs = data["inputs"]
        if isinstance(inputs, Mapping) and "prompt" in inputs:
            self.check_inputs(inputs, _child(node, "inputs"), at)
        elif inputs is None or (isinstance(inputs, str) and not inputs.strip()):
            raise self.fail(_child(node, "inputs") or node, f"{at}.inputs: the prompt is empty")
        name = data.get("name")
        line = node.start_mark.line + 1 if node is not None else None
        return Case(str(name) if name is not None else f"case-{i + 1}", inputs, data.get("expected_output"),
                    data.get("metadata"), self.evaluators(data.get("evaluators"), _child(node, "evaluators"),
                                                          f"{at}.evaluators"), line)

    def check_inputs(self, inputs: Mapping[str, Any], node: Any, at: str) -> None:
        if unknown := set(inputs) - INPUT_KEYS:
            raise self.fail(node, f"{at}.inputs: unknown key(s) {sorted(unknown)}; with `prompt`, inputs may "
                            f"have {sorted(INPUT_KEYS)}")
        if not isinstance(inputs["prompt"], str) or not inputs["prompt"].strip():
            raise self.fail(node, f"{at}.inputs.prompt: the prompt is a non-empty text")
        if "model" in inputs and not isinstance(inputs["model"], str):
            raise self.fail(node, f"{at}.inputs.model: a model name, provider:name")
        history = inputs.get("history") or []
        if not isinstance(history, list):
            raise self.fail(node, f"{at}.inputs.history: a list of messages ({{role: user, content: …}})")
        for j, message in enumerate(history):
            try:
                message_of(message)
            except Exception as exc:
                raise self.fail(_item(_child(node, "history"), j),
                                f"{at}.inputs.history[{j}]: not a message ({_first_error(exc)}); write "
                                "{role: user|assistant, content: text}") from None

    def evaluators(self, data: Any, node: Any, at: str) -> list[Evaluator]:
        if data is None:
            return []
        if not isinstance(data, list):
            raise self.fail(node, f"{at}: a list of evaluators (- EqualsExpected, - Contains: text)")
        return [self.evaluator(spec, _item(node, i), f"{at}[{i}]") for i, spec in enumerate(data)]

    def evaluator(self, spec: Any, node: Any, at: str) -> Evaluator:
        if isinstance(spec, str):
            name, args = spec, None
        elif isinstance(spec, Mapping) and len(spec) == 1:
            [(name, args)] = spec.items()
        else:
            raise self.fail(node, f"{at}: write an evaluator as `- Name`, `- Name: value` or "
                            "`- Name: {field: value}`")
        cls = self.resolve(str(name), node, at)
        try:
            if args is None:
                return cls()
            if isinstance(args, Mapping):
                return cls(**args)
            return cls(args)
        except (TypeError, ValueError) as exc:
            names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
            raise self.fail(node, f"{at}: {name}: {exc}; its fields are {names}") from None

    def resolve(self, name: str, node: Any, at: str) -> type:
        if name in self.types:
            return self.types[name]
        if ":" in name:
            module, _, attr = name.partition(":")
            folder = str(self.folder)
            sys.path.insert(0, folder)
            try:
                cls = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as exc:
                raise self.fail(node, f"{at}: cannot import evaluator {name!r} ({exc}); name a class as "
                                "module:Class, importable from the dataset's folder") from None
            finally:
                sys.path.remove(folder)
            if not callable(getattr(cls, "evaluate", None)):
                raise self.fail(node, f"{at}: {name} has no evaluate(ctx) method")
            return cls
        raise self.fail(node, f"{at}: unknown evaluator {name!r}; known: {', '.join(sorted(self.types))} (or "
                        "a custom class as module:Class)")


def _first_error(exc: Exception) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return f"{'.'.join(map(str, first['loc']))}: {first['msg']}"
    return str(exc)


def _child(node: Any, key: str) -> Any:
    if node is None or not isinstance(node, yaml.MappingNode):
        return None
    return next((v for k, v in node.value if getattr(k, "value", None) == key), None)


def _item(node: Any, i: int) -> Any:
    if node is None or not isinstance(node, yaml.SequenceNode) or i >= len(node.value):
        return None
    return node.value[i]


def cases_named(dataset: Dataset, names: Sequence[str]) -> list[Case]:
    """The dataset's cases with these names (all when none); an unknown name is a DatasetError."""
    if not names:
        return list(dataset.cases)
    known = {c.name: c for c in dataset.cases}
    if missing := [n for n in names if n not in known]:
        raise DatasetError(f"{dataset.path or '<dataset>'}: no case named {missing}; it has {sorted(known)}")
    return [known[n] for n in names]
