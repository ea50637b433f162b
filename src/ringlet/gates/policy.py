"""The policy gate's engine (`gates.md` §3): real Rego (v1), evaluated by `regopy`, the OPA language.

    policies = PolicySet.load(["policies/ops.rego"])       # load errors name the file and line
    verdict = policies.evaluate(input_document)            # {"deny": [...], "require_approval": [...]}

A set is compiled once into a bundle whose single query collects `deny` and `require_approval` of every
loaded package (`ringlet` and `ringlet.*`), so each evaluation only sets the input and runs the plan.

Decisions are cached when the set is pure: no built-in that reads the world (`time.now_ns`, `http.send`,
random numbers, …), no `with`, and every use of `input` a dotted path (`input.resource.tool`). Then the
verdict depends only on those paths, so it is kept (up to `CACHE_SIZE` inputs) under the values the policies
read, each path cut to its first two keys (`input.args.name` reads all of `args`). A new set (a reload) starts
with an empty cache; errors are never cached.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringlet.errors import ConfigError, PolicyError

_PACKAGE = re.compile(r"^\s*package\s+([A-Za-z_][\w.]*)\s*(?:#.*)?$", re.M)
_V0_HEAD = re.compile(r"^\s*(deny|require_approval)\s*\[[^\]]*\]\s*(?:\{|if\b|:?=(?!=))", re.M)
_DOTTED_HEAD = re.compile(r"^\s*(?:default\s+)?[A-Za-z_][\w.]*\.(deny|require_approval)\b", re.M)
_RULE_HEAD = re.compile(r"^\s*(?:default\s+)?(deny|require_approval)\b(\s+contains\b)?", re.M)
_COMMENT = re.compile(r"#[^\n]*")
_INPUT = re.compile(r"\binput\b(?P<path>(?:\.[A-Za-z_]\w*)*)")
_IMPURE = re.compile(r"\b(?:time\.now_ns|http\.send|rand\.|uuid\.|opa\.runtime|net\.|trace)\s*\(|\bwith\b")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|`[^`]*`')
RULES = ("deny", "require_approval")
CACHE_SIZE = 4096


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the policies say about one call: deny messages and require_approval messages, each as
    `(message, policy_id)`."""

    deny: tuple[tuple[str, str], ...] = ()
    require_approval: tuple[tuple[str, str], ...] = ()


@dataclass(eq=False)
class PolicySet:
    """A compiled, immutable set of policy modules; `evaluate()` is thread-safe."""

    modules: dict[str, str]
    packages: tuple[str, ...]
    hash: str | None
    _bundle: Any = None
    _local: threading.local = field(default_factory=threading.local)
    _direct: tuple[tuple[bool, ...], ...] = ()
    """Per package and rule: queried directly (a `contains` set), else as `[[type, value]]` or `[]`."""
    reads: tuple[tuple[str, ...], ...] | None = None
    """The input paths the policies read (two keys deep), when the set is pure; None: never cached."""
    _cache: dict[str, Verdict] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> PolicySet:
        """No policy: every call is allowed (audited with `policy_set_hash: null`)."""
        return cls({}, (), None)

    @classmethod
    def load(cls, paths: Iterable[str | Path]) -> PolicySet:
        """Read `*.rego` files (a directory means its `*.rego` files) and compile them."""
        modules: dict[str, str] = {}
        for given in paths:
            path = Path(given).expanduser()
            files = sorted(path.glob("*.rego")) if path.is_dir() else [path]
            for file in files:
                try:
                    modules[str(file)] = file.read_text(encoding="utf-8")
                except OSError as exc:
                    raise ConfigError(f"policy file {file}: {exc.strerror or exc}") from None
        return cls.compile(modules)

    @classmethod
    def compile(cls, modules: dict[str, str]) -> PolicySet:
        """Check and compile `{file name: Rego source}`; a problem is a ConfigError naming file and line."""
        if not modules:
            return cls.empty()
        try:
            from regopy import Interpreter, RegoError
        except ImportError:
            raise ConfigError("Rego policies need the 'policy' extra: pip install 'ringlet[policy]'") from None
        defined: dict[str, dict[str, bool]] = {}
        """package -> rule -> whether every head of it is `rule contains …` (a set that always exists)"""
        for name, text in modules.items():
            source = _COMMENT.sub("", text)  # the checks below read code, not comments
            found = _PACKAGE.search(source)
            if found is None:
                raise ConfigError(f"{name}: no `package ringlet` or `package ringlet.<name>` line")
            package = found.group(1)
            if package != "ringlet" and not package.startswith("ringlet."):
                line = source[:found.start(1)].count("\n") + 1
                raise ConfigError(f"{name}:{line}: package {package!r} is not ringlet or ringlet.*; ringlet "
                                  "queries data.ringlet.deny and data.ringlet.require_approval")
            if (v0 := _V0_HEAD.search(source)) is not None:
                line = source[:v0.start(1)].count("\n") + 1
                raise ConfigError(f"{name}:{line}: `{v0.group(1)}[msg] {{ … }}` is Rego v0 syntax, which v1 reads "
                                  f"as an object, not a set; write `{v0.group(1)} contains msg if {{ … }}`")
            if (dotted := _DOTTED_HEAD.search(source)) is not None:
                line = source[:dotted.start()].count("\n") + 1
                raise ConfigError(f"{name}:{line}: a dotted rule name for `{dotted.group(1)}` defines it in a "
                                  "sub-package ringlet does not query; put it in its own file with `package "
                                  "ringlet.<name>`")
            rules = defined.setdefault(package, {})
            for rule, contains in _RULE_HEAD.findall(source):
                rules[rule] = rules.get(rule, True) and bool(contains)
        packages = sorted(defined)
        interpreter = Interpreter()
        try:
            for name, source in modules.items():
                interpreter.add_module(name, source)
            bundle = interpreter.build(_query(packages, defined))
        except RegoError as exc:
            raise ConfigError(f"policy compile error: {_rego_message(exc, modules)}") from None
        digest = hashlib.sha256(json.dumps(sorted(modules.items())).encode()).hexdigest()
        return cls(dict(modules), tuple(packages), digest, bundle,
                   _direct=tuple(tuple(defined[p].get(rule, False) for rule in RULES) for p in packages),
                   reads=_input_reads(modules.values()))

    def key(self, document: dict[str, Any]) -> str | None:
        """The cache key of an input document: the values at the paths the policies read (None: not cached)."""
        if self.reads is None:
            return None
        values = []
        for path in self.reads:
            value: Any = document
            for step in path:
                value = value.get(step) if isinstance(value, dict) else None
            values.append(value)
        return json.dumps(values, sort_keys=True, default=str)

    def cached(self, document: dict[str, Any]) -> Verdict | None:
        """The verdict an equal input got before, if it is still cached."""
        key = self.key(document)
        return self._cache.get(key) if key is not None else None

    def evaluate(self, document: dict[str, Any]) -> Verdict:
        """Run the compiled plan on an input document. Raises `PolicyError` on an engine error or a rule
        whose value is not a set."""
        if self._bundle is None:
            return Verdict()
        from regopy import Input, Interpreter, RegoError

        interpreter = getattr(self._local, "interpreter", None)
        if interpreter is None:
            interpreter = self._local.interpreter = Interpreter()
        try:
            interpreter.set_input(Input(document))
            output = interpreter.query_bundle(self._bundle)
        except RegoError as exc:
            raise PolicyError(_rego_message(exc)) from None
        if not output.ok():
            raise PolicyError(str(output))
        try:
            values = json.loads(str(output))["bindings"]["x"]
        except (ValueError, KeyError, TypeError):
            raise PolicyError(f"the policies gave no usable result: {str(output)[:300]}") from None
        found: dict[str, list[tuple[str, str]]] = {rule: [] for rule in RULES}
        for package, pair, direct in zip(self.packages, values, self._direct, strict=True):
            for rule, typed, is_set in zip(RULES, pair, direct, strict=True):
                if is_set:
                    found[rule] += [_message(item, package) for item in typed]
                    continue
                if not typed:  # no value for this input (e.g. `deny := {…} if …` whose body is false)
                    continue
                kind, value = typed[0]
                if kind != "set":
                    raise PolicyError(f"data.{package}.{rule} is a {kind}, not a set; define it with "
                                      f"`{rule} contains msg if {{ … }}`")
                found[rule] += [_message(item, package) for item in value]
        return self._remember(document, Verdict(tuple(found["deny"]), tuple(found["require_approval"])))

    def _remember(self, document: dict[str, Any], verdict: Verdict) -> Verdict:
        key = self.key(document)
        if key is not None:
            if len(self._cache) >= CACHE_SIZE:
                self._cache.clear()  # simple and bounded: a busy set refills with what it sees now
            self._cache[key] = verdict
        return verdict


def _input_reads(sources: Iterable[str]) -> tuple[tuple[str, ...], ...] | None:
    """The input paths (cut to two keys) a pure set of modules reads; None when a module is not pure or uses
    `input` other than by a dotted path (`input[k]`, `x := input`), so its verdicts may not be cached."""
    paths: set[tuple[str, ...]] = set()
    for source in sources:
        code = _STRING.sub('""', _COMMENT.sub("", source))
        if _IMPURE.search(code):
            return None
        for use in _INPUT.finditer(code):
            steps = tuple(use["path"].split(".")[1:3])
            if not steps:
                return None  # the whole input (`x := input`, `input[k]`, `some k in input`)
            paths.add(steps)
    return tuple(sorted(p for p in paths if not any(p[:n] in paths for n in range(1, len(p)))))


def _query(packages: Sequence[str], defined: dict[str, dict[str, bool]]) -> str:
    """One query for every package's two rules. A rule written only as `rule contains …` is a set that
    always exists (empty when nothing matches): it is referenced directly, the cheapest form. Any other
    rule is read as `[[type, value]]`, or `[]` when it has no value (an undefined rule must not make the
    whole query undefined), and its type is checked after."""

    def part(p: str, rule: str) -> str:
        if rule not in defined[p]:
            return "[]"
        return f"data.{p}.{rule}" if defined[p][rule] else f"[[type_name(r), r] | r := data.{p}.{rule}]"

    pairs = ("[" + ", ".join(part(p, rule) for rule in RULES) + "]" for p in packages)
    return "x := [" + ", ".join(pairs) + "]"


def _message(item: Any, package: str) -> tuple[str, str]:
    if isinstance(item, dict):
        return str(item.get("msg", item)), str(item.get("policy_id") or package)
    return (item if isinstance(item, str) else json.dumps(item)), package


def _rego_message(exc: Exception, modules: dict[str, str] | None = None) -> str:
    """The engine's error, reduced to its messages with `file:line:column`."""
    text = str(exc)
    messages = re.findall(r"\(errormsg \d+:([^)]*)\)", text)
    places = re.findall(r"\(error \d+:([^|\s]+)\|(\d+)", text)
    if not messages:
        return " ".join(text.split())[:500]
    out = []
    for i, message in enumerate(messages):
        if i < len(places):
            file, offset = places[i][0], int(places[i][1])
            source = (modules or {}).get(file)
            if source is not None:
                line = source.count("\n", 0, offset) + 1
                column = offset - (source.rfind("\n", 0, offset) + 1) + 1
                out.append(f"{file}:{line}:{column}: {message}")
                continue
            out.append(f"{file} (offset {offset}): {message}")
        else:
            out.append(message)
    return "; ".join(out)
