"""Reading one `config.yaml`: parsed, validated into `AgentConfig`, and every problem reported with the
file, line and column of the YAML node it is about (and a did-you-mean for an unknown key)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, cast

import yaml
from pydantic import ValidationError

from ringlet.agent.config.schema import AgentConfig
from ringlet.errors import ConfigError


def _node_at(node: yaml.Node, loc: tuple[Any, ...]) -> tuple[yaml.Node, yaml.Node | None]:
    """The YAML node for a pydantic error location, and the key node of its last step. A step that is no
    key of its mapping but the value of one is a tagged union's tag (`rails.0.pii.kinds`): skipped."""
    key_node = None
    for i, step in enumerate(loc):
        if isinstance(node, yaml.MappingNode):
            if _is_tag(node, loc, i):
                continue
            match = next(((k, v) for k, v in node.value if k.value == str(step)), None)
            if match is None:
                break
            key_node, node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
            node, key_node = node.value[step], None
        else:
            break
    return node, key_node


def _is_tag(node: yaml.MappingNode, loc: tuple[Any, ...], i: int) -> bool:
    """A step that is no key of the mapping but the value of one (`type: pii`) is a tagged union's tag."""
    return i + 1 < len(loc) and isinstance(loc[i], str) and not any(k.value == loc[i] for k, _ in node.value) \
        and any(isinstance(v, yaml.ScalarNode) and v.value == loc[i] for _, v in node.value)


def _is_tag_at(root: yaml.Node, loc: tuple[Any, ...], i: int) -> bool:
    """Whether step `i` of `loc` is a tagged union's tag (for the field's name in a message)."""
    node, _ = _node_at(root, loc[:i])
    return isinstance(node, yaml.MappingNode) and _is_tag(node, loc, i)


def _compose(text: str) -> yaml.Node | None:
    """The YAML node tree of `text` (`yaml.compose` with the safe loader), for the lines of errors."""
    loader = yaml.SafeLoader(text)
    try:
        return loader.get_single_node()
    finally:
        cast(Any, loader).dispose()  # (its stub leaves the return type out)


def load_config(path: Path) -> AgentConfig:
    """Parse and validate one config.yaml; a ConfigError lists every problem with file:line."""
    try:
        text = path.read_text(encoding="utf-8")
        root = _compose(text)
        data: Any = yaml.safe_load(text)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return AgentConfig()
    if not isinstance(data, dict) or root is None:
        raise ConfigError(f"{path}:1: the file must be a mapping of settings (key: value)")
    from ringlet.agent.loki import IGNORED_KEYS, warn_ignored

    given = cast("dict[str, Any]", data)
    warn_ignored([k for k in given if k in IGNORED_KEYS], path)
    given = {k: v for k, v in given.items() if k not in IGNORED_KEYS}
    try:
        return AgentConfig.model_validate(given)
    except ValidationError as exc:
        problems = [_describe(path, root, e) for e in exc.errors()]
        raise ConfigError("invalid agent config:\n  " + "\n  ".join(problems)) from None


def _describe(path: Path, root: yaml.Node, error: Any) -> str:
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and "[" in p))  # without union tags
    node, key_node = _node_at(root, loc)
    loc = tuple(p for i, p in enumerate(loc) if not _is_tag_at(root, loc, i))
    mark = (key_node or node).start_mark
    where = f"{path}:{mark.line + 1}:{mark.column + 1}"
    field = ".".join(map(str, loc))
    if error["type"] == "extra_forbidden":
        known = AgentConfig.model_fields if len(loc) == 1 else {}
        hint = difflib.get_close_matches(str(loc[-1]), known, n=1)
        fix = f"; did you mean {hint[0]!r}?" if hint else f"; known keys: {', '.join(known)}" if known else ""
        return f"{where}: unknown key {field!r}{fix}"
    return f"{where}: {field}: {error['msg'].removeprefix('Value error, ')}"
