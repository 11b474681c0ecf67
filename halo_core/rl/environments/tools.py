"""Built-in tools (the ``halo.tools`` group): ``calculator`` and ``python``."""

from __future__ import annotations

import ast
import operator

from halo_core.rl import execution
from halo_core.rl.sandbox import executes_code, run_python

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def _value(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e6):  # 9**9**9 would never end
            raise ValueError("exponent too large")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"unsupported: {ast.unparse(node)!r}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Numbers with + - * / // % ** and parentheses, e.g. "(3 + 4) * 12".

    Returns:
        The expression's value.
    """
    return str(_value(ast.parse(expression.strip(), mode="eval").body))


@executes_code
def python(code: str) -> str:
    """Run a Python program and see what it prints.

    Args:
        code: The program; print what you want to see.

    Returns:
        What it printed, then any error, cut to 1000 characters.
    """
    run = execution.run_one(run_python, code, 10.0, 512)  # on this machine's pool or a Ray worker (execution_backend)
    if run is None:
        raise RuntimeError("the sandbox's worker crashed; the program may not have run")  # TRL hands the model an error
    error = run.stderr.strip().splitlines()[-1:] if run.returncode else ["(timed out after 10 s)"] if run.timed_out else []
    return "\n".join([run.stdout.rstrip("\n"), *error]).strip("\n")[:1000]
