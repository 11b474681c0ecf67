"""The fast tier (``-m "not slow"``, README) leaves out every test that starts ranks or runs: a test that spawns a
layout, runs the conformance kit or a real ``halo launch`` is marked ``slow`` (its file with ``pytestmark``, or the test
itself), or the everyday run would grow by minutes without anyone choosing it."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent
#: Calls that start processes: spawned ranks, the kits that spawn them, ``launch_kit.launch`` (a real ``halo launch``)
#: and ``subprocess.Popen`` (servers, launches stopped midway). A ``--dry-run`` through ``run_halo`` starts no rank.
STARTERS = {"spawn", "run_layouts", "run_composite_layouts", "check_family", "launch", "Popen"}
#: What the session fixture ``method_runs`` (conftest.py) launches on first use: its one-process and layout runs.
SHARED_RUNS = {"single", "layout", "launch"}


def _starts(node: ast.AST) -> bool:
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            func = call.func
            if (isinstance(func, ast.Name) and func.id in STARTERS) or (isinstance(func, ast.Attribute) and func.attr == "Popen"):
                return True
            if isinstance(func, ast.Attribute) and func.attr in SHARED_RUNS and ast.unparse(func.value) == "method_runs":
                return True
    return False


def _marked_slow(decorators: list[ast.expr]) -> bool:
    return any(ast.unparse(d) == "pytest.mark.slow" for d in decorators)


def unmarked(path: Path) -> list[str]:
    """What in ``path`` starts processes without a ``slow`` mark: each such test, or a helper or fixture (which only the
    file's ``pytestmark`` can cover)."""
    tree = ast.parse(path.read_text())
    if any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in n.targets) and "pytest.mark.slow" in ast.unparse(n.value)
           for n in tree.body):
        return []
    found = []
    for node in tree.body:
        if not _starts(node):
            continue
        name = getattr(node, "name", ast.unparse(node)[:40])
        if not (isinstance(node, ast.FunctionDef) and name.startswith("test_") and _marked_slow(node.decorator_list)):
            found.append(name)
    return found


def test_every_test_that_starts_ranks_is_marked_slow():
    missing = {p.name: names for p in sorted(TESTS.glob("test_*.py")) if (names := unmarked(p))}
    assert not missing, f"these start processes without pytest.mark.slow (on the test, or pytestmark for the file): {missing}"


def test_the_check_finds_a_launch_in_a_helper_and_accepts_a_marked_test(tmp_path):
    """The check itself: a helper that spawns needs the file's mark; a spawning test marked slow passes."""
    helper = tmp_path / "test_a.py"
    helper.write_text("def _run():\n    spawn(f, 2)\n\ndef test_x():\n    _run()\n")
    marked = tmp_path / "test_b.py"
    marked.write_text("import pytest\n\n@pytest.mark.slow\ndef test_y():\n    launch('sft', c, o, 2)\n\ndef test_z():\n    run_halo('launch', '--dry-run')\n")
    shared = tmp_path / "test_c.py"  # the session's shared runs launch on first use; their run file alone does not
    shared.write_text("def test_u(method_runs):\n    method_runs.single('dpo')\n\ndef test_v(method_runs):\n    method_runs.config('dpo')\n")
    assert unmarked(helper) == ["_run"] and unmarked(marked) == [] and unmarked(shared) == ["test_u"]
