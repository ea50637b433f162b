"""A graph as a Mermaid flowchart (`ringlet graph show DIR`).

Shapes by node type: llm (rounded), agent (parallelogram), script (subroutine), approval and input
(rhombus), rag (cylinder), map (hexagon), end (stadium). Dotted arrows are fallbacks and map branches;
labelled arrows are approval routes.
"""

from __future__ import annotations

import re

from ringlet.graph.spec import ApprovalNode, GraphSpec, MapNode

__all__ = ["to_mermaid"]

_SHAPES = {
    "llm": ("(", ")"), "agent": ("[/", "/]"), "script": ("[[", "]]"), "approval": ("{", "}"),
    "input": ("{", "}"), "rag": ("[(", ")]"), "map": ("{{", "}}"), "end": ("([", "])"),
}
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def _id(node_id: str) -> str:
    """A Mermaid-safe id (`end` and punctuation are not): every id gets a prefix."""
    return "n_" + _UNSAFE.sub("_", node_id)


def _label(text: str) -> str:
    return '"' + text.replace('"', "#quot;") + '"'


def to_mermaid(spec: GraphSpec, *, direction: str = "TD") -> str:
    """The flowchart text: a start marker, one line per node, then one per edge."""
    lines = [f"flowchart {direction}", f"    __start__(({_label('start')})) --> {_id(spec.start)}"]
    for node_id, node in spec.nodes.items():
        left, right = _SHAPES[node.type]
        lines.append(f"    {_id(node_id)}{left}{_label(f'{node_id} ({node.type})')}{right}")
    known = set(spec.nodes)
    for node_id, node in spec.nodes.items():
        src = _id(node_id)
        lines.extend(f"    {src} --> {_id(target)}" for target in node.targets)
        if isinstance(node, ApprovalNode):
            for option, target in node.routes.items():
                lines.append(f"    {src} -- {_label(option)} --> {_id(target)}")
            lines.append(f"    {src} -- {_label('other')} --> {_id(node.on_other)}")
        fallback = getattr(node, "fallback", None)
        if fallback:
            lines.append(f"    {src} -. {_label('fallback')} .-> {_id(fallback)}")
        if isinstance(node, MapNode):
            lines.append(f"    {src} -. {_label(f'each {node.as_}')} .-> {_id(node.branch)}")
    missing = [t for t in dict.fromkeys(t for n in spec.nodes.values() for t in n.targets) if t not in known]
    lines.extend(f"    {_id(target)}:::missing" for target in missing)  # drawn and marked; the validator reports them
    if missing:
        lines.append("    classDef missing stroke:#d00,stroke-dasharray:4")
    return "\n".join(lines) + "\n"
