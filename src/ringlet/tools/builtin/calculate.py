"""`calculate` (`builtin-tools-and-subagents.md` §1): exact arithmetic on a parsed expression (never `eval`),
bounded so no expression eats CPU or memory, and the percentages and unit conversions of `units`."""

from __future__ import annotations

import ast
import math
import operator

from ringlet.tools.builtin.units import UnitError, arithmetic_text, conversion, percentage
from ringlet.tools.function import tool

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
        ast.USub: operator.neg, ast.UAdd: operator.pos}
_FUNCS = {"sqrt": math.sqrt, "log": math.log, "exp": math.exp, "sin": math.sin, "cos": math.cos,
          "tan": math.tan, "abs": abs, "round": round, "min": min, "max": max}
_CONSTS = {"pi": math.pi, "e": math.e}
MAX_BITS = 4096  # results are kept to numbers of about 1,200 digits: no expression may eat CPU or memory


def _bounded(value: float) -> float:
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise ValueError("the result is too large")
    return value


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTS:
        return _CONSTS[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(left) > 1 and abs(right) * math.log2(abs(left)) > MAX_BITS:
            raise ValueError(f"{left} ** {right} is too large")
        return _bounded(_OPS[type(node.op)](left, right))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords:
        return _FUNCS[node.func.id](*(_eval(a) for a in node.args))
    raise ValueError(f"unsupported expression: {ast.unparse(node)}")


@tool(effect="read", timeout_s=5)
def calculate(expression: str) -> str:
    """Exact arithmetic, percentages and unit conversions, e.g. "17 * 23", "15% of 80", "7 inches to cm".

    Args:
        expression: Arithmetic ("(17 * 23) / 4", "sqrt(2) * pi"), a percentage ("15% of 80", "what percent
            of 48 is 12", "90 - 10%") or a conversion ("5 km to miles", "50 f to c", "45 mph to kph").
    """
    try:
        for words in (percentage, conversion):
            if (answer := words(expression)) is not None:
                return answer
        value = _eval(ast.parse(arithmetic_text(expression), mode="eval"))
    except UnitError as exc:
        return f"cannot convert {expression!r}: {exc}"
    except (SyntaxError, ValueError, TypeError, ZeroDivisionError, OverflowError) as exc:
        return f"cannot evaluate {expression!r}: {exc}"
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
