"""The ``swe`` environment (issue 47, item 3): a patch to the bundled git repository, applied in the sandbox on a copy,
graded by the repository's own tests with every top-level ``assert`` decided outside the patched code. A right patch
scores 1; a wrong one, one that touches the tests, one that escapes the repository, forges its exit or returns an
object equal to anything, 0. Then the tool loop in process (a scripted policy reads a file and answers with a patch) and the
embedded default through ``halo launch grpo``. Each grading is a sandboxed process of a fraction of a second."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from halo_core.rl import sandbox
from halo_core.rl.environments import load_environment
from halo_core.rl.environments.swe import base_files, grade, is_test_file, patch_of, selected_tests, swe_tests

TINY = Path(__file__).resolve().parents[1] / "templates" / "tiny"
ROWS = [json.loads(line) for line in (TINY / "data" / "swe.jsonl").read_text().splitlines()]
REPO = str(TINY / "swe" / "statslib.bundle")
COMMIT = ROWS[0]["base_commit"]
needs_isolation = pytest.mark.skipif(sandbox.isolation() is None, reason="neither bwrap nor unshare works here (test_sandbox tests the refusal)")


def diff(path: str, old: str, new: str, context: int = 3) -> str:
    """A unified diff (git's a/ b/ form) replacing ``old`` with ``new`` in the base commit's file."""
    before = base_files(REPO, COMMIT)[path].decode() if path in base_files(REPO, COMMIT) else ""
    assert old in before or not before, f"{old!r} is not in {path}"
    after = before.replace(old, new) if before else new
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{path}" if before else "/dev/null", f"b/{path}", n=context))


MEAN_FIX = diff("statslib/stats.py", "(len(values) - 1)", "len(values)")
MEDIAN_FIX = diff("statslib/stats.py", "    return ordered[len(ordered) // 2]",
                  "    middle = len(ordered) // 2\n    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2")
PATCHES = {  # name: (patch, the task it is for, reward)
    "the right fix": (MEAN_FIX, 0, 1.0),
    "the right fix of the other bug": (MEDIAN_FIX, 1, 1.0),
    "a fix that passes one test of two": (diff("statslib/stats.py", "(len(values) - 1)", "max(len(values) - 1, 1)"), 0, 0.0),
    "the other bug's fix": (MEDIAN_FIX, 0, 0.0),
    "no patch at all": ("I could not find the bug.", 0, 0.0),
    "a patch that does not apply": (MEAN_FIX.replace("(len(values) - 1)", "(len(values) - 2)"), 0, 0.0),
    "the fix and a weakened test": (MEAN_FIX + diff("tests/test_mean.py", "assert mean([5]) == 5", "pass"), 0, 0.0),
    "a weakened test alone": (diff("tests/test_mean.py", "assert mean([1, 2, 3]) == 2", "assert True"), 0, 0.0),
    "the fix and a new conftest": (MEAN_FIX + diff("tests/conftest.py", "", "collect_ignore = ['test_mean.py']\n"), 0, 0.0),
    "a patch escaping the repository": (MEAN_FIX.replace("a/statslib/stats.py", "a/../stats.py").replace("b/statslib/stats.py", "b/../stats.py"), 0, 0.0),
    "os._exit(0) at import": (diff("statslib/stats.py", "def mean(values):", "import os\nos._exit(0)\n\n\ndef mean(values):"), 0, 0.0),
    "SystemExit at import": (diff("statslib/stats.py", "def mean(values):", "raise SystemExit(0)\n\n\ndef mean(values):"), 0, 0.0),
    "an __eq__ that always holds": (diff("statslib/stats.py", "    return sum(values) / (len(values) - 1)",
                                         "    class Any:\n        def __eq__(self, other):\n            return True\n    return Any()"), 0, 0.0),
}


@needs_isolation
@pytest.mark.parametrize("name", list(PATCHES))
def test_the_repositorys_tests_grade_the_patch(name):
    patch, task, reward = PATCHES[name]
    row = ROWS[task]
    completion = [{"role": "assistant", "content": f"Here is the fix:\n```diff\n{patch}```"}]
    assert swe_tests(None, [completion], repo=[row["repo"] if Path(row["repo"]).is_absolute() else REPO], base_commit=[row["base_commit"]],
                     test_command=[row["test_command"]], timeout_s=10.0) == [reward]


@needs_isolation
def test_the_grader_says_why_a_patch_failed():
    command = ROWS[0]["test_command"]
    assert grade(MEAN_FIX, REPO, COMMIT, command, 10.0).passed == 2
    touched = grade(MEAN_FIX + diff("tests/test_mean.py", "assert mean([5]) == 5", "pass"), REPO, COMMIT, command, 10.0)
    assert "the patch changes the test file tests/test_mean.py" in touched.failures[0], touched
    added = grade(MEAN_FIX + diff("tests/conftest.py", "", "x = 1\n"), REPO, COMMIT, command, 10.0)
    assert "the patch adds the test file tests/conftest.py" in added.failures[0], added
    missing = grade(MEAN_FIX, REPO, COMMIT, "pytest tests/test_mean.py::test_mean_of_three tests/test_mean.py::test_nope", 10.0)
    assert (missing.passed, missing.total) == (1, 2) and "has no module-level test function 'test_nope'" in missing.failures[0], missing
    half = grade(diff("statslib/stats.py", "(len(values) - 1)", "max(len(values) - 1, 1)"), REPO, COMMIT, command, 10.0)
    assert (half.passed, half.total) == (1, 2) and "AssertionError: 3.0 Eq 2" in half.failures[0], half


@needs_isolation
def test_every_assert_of_a_test_is_decided_by_the_grader():
    """A test's earlier asserts are decided outside the solution too, not only its last (an always-equal object
    returned for the first call used to pass it inside the solution's process)."""
    solution = "class Any:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return Any() if x == 1 else x"
    report = sandbox.run_tests(solution, ["assert f(1) == 5\nassert f(2) == 2", "y = f(3)\nassert y == 3\nassert f(4) == 4"], 5.0, 256)
    assert (report.passed, report.total) == (1, 2) and "not plain data" in report.failures[0], report


def test_files_outside_the_sandboxs_folder_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not a relative path inside"):
        sandbox._place(tmp_path, {"../escape.py": b"x"}, None)
    sandbox._place(tmp_path, {"repo/a/b.py": b"x = 1\n"}, None)
    assert (tmp_path / "repo" / "a" / "b.py").read_text() == "x = 1\n"


def test_the_rows_tests_and_patches_are_read_as_pytest_and_git_would():
    files = base_files(REPO, COMMIT)
    assert sorted(files) == ["README.md", "statslib/__init__.py", "statslib/stats.py", "tests/test_mean.py", "tests/test_median.py"]
    assert selected_tests("python -m pytest -q tests/test_mean.py", files) == {"tests/test_mean.py": []}
    assert selected_tests("pytest tests/test_median.py::test_median_of_an_even_count", files) == {"tests/test_median.py": ["test_median_of_an_even_count"]}
    assert selected_tests("pytest tests", files) == {"tests/test_mean.py": [], "tests/test_median.py": []}
    with pytest.raises(ValueError, match="names 'tests/test_nope.py', which the base commit does not hold"):
        selected_tests("pytest tests/test_nope.py", files)
    assert [p for p in ("tests/helpers.py", "test_x.py", "pkg/x_test.py", "conftest.py", "statslib/stats.py", "testing.py") if is_test_file(p)] \
        == ["tests/helpers.py", "test_x.py", "pkg/x_test.py", "conftest.py"]
    assert patch_of("no diff here") is None
    assert patch_of(f"Fixed:\n{MEAN_FIX}") == MEAN_FIX
    assert patch_of([{"role": "assistant", "content": "first"}, {"role": "tool", "content": "x"},
                     {"role": "assistant", "content": f"```diff\n{MEAN_FIX}```"}]) == MEAN_FIX


def test_the_environment_shows_the_repository_and_refuses_a_row_without_one():
    environment = load_environment("swe")()
    said = environment.reset(prompt="Fix it.", repo=REPO, base_commit=COMMIT, test_command=ROWS[0]["test_command"])
    assert "statslib/stats.py" in said and "unified diff" in said
    assert "(len(values) - 1)" in environment.read_file("statslib/stats.py")
    with pytest.raises(FileNotFoundError):
        environment.read_file("../../etc/hostname")
    with pytest.raises(ValueError, match="repo 'nowhere' is not a git repository"):
        environment.reset(repo="nowhere", base_commit=COMMIT, test_command="pytest tests")


def test_a_json_sources_repo_is_taken_from_its_files_folder(tmp_path, monkeypatch):
    from halo_core.trainers.arguments import DatasetSource
    from halo_core.trainers.parts.data import load_source

    monkeypatch.chdir(tmp_path)  # not where the data is
    loaded = load_source(DatasetSource(str(TINY / "data" / "swe.jsonl")))
    assert Path(loaded[0]["repo"]) == TINY / "data" / ".." / "swe" / "statslib.bundle" and Path(loaded[0]["repo"]).is_file()
    other = tmp_path / "rows.jsonl"
    other.write_text(json.dumps({"prompt": "x", "repo": "owner/name"}) + "\n")
    assert load_source(DatasetSource(str(other)))[0]["repo"] == "owner/name"  # not a path beside the file: as written


def test_the_policy_reads_the_repository_and_its_patch_is_graded(tmp_path, monkeypatch):
    """One GRPO step in process, the engine scripted: every conversation reads a file through ``read_file``
    (TRL hands it back without loss), then answers with a patch, the right fix for half the rows; ``swe_tests``
    scores them in the sandbox."""
    from test_environments import _rows, assert_spans, tool_call, train_one_step

    if sandbox.isolation() is None:
        pytest.skip("neither bwrap nor unshare works here (test_sandbox tests the refusal)")
    rows = [dict(row, repo=REPO) for row in ROWS]

    def script(tokenizer, row, turn, prompt):
        if turn == 0:  # each conversation its own first turn
            return tool_call(tokenizer, "qwen3", "read_file", {"path": "statslib/__init__.py" if row % 2 else "./statslib/__init__.py"})
        # one line of context: the scripted engine spells every character as a token, within max_completion_length
        fix = diff("statslib/stats.py", "(len(values) - 1)", "len(values)", context=1)
        if "median([4, 1, 3, 2]) returns 3" in prompt:
            fix = diff("statslib/stats.py", "    return ordered[len(ordered) // 2]", "    return (ordered[len(ordered) // 2 - 1] + "
                       "ordered[len(ordered) // 2]) / 2 if len(ordered) % 2 == 0 else ordered[len(ordered) // 2]", context=1)
        return f"```diff\n{fix if row % 2 == 0 else fix.replace('+    return ', '+    return 1 + ')}```<|im_end|>"

    tokenizer, engine, seen, trainer = train_one_step(tmp_path, monkeypatch, "qwen3", script, rows, environment="swe",
                                                      reward_funcs=["swe_tests"])
    said = [tokenizer.decode(assert_spans(row, engine.emitted)[1]) for row in _rows(seen)]
    assert all("from statslib.stats import mean, median" in s for s in said), said
    logged = trainer.state.log_history[0]
    assert logged["tools/call_frequency"] == 1.0 and logged["rewards/swe_tests/mean"] == 0.5, logged


def test_the_embedded_default_runs_through_halo_launch(tmp_path):
    """``templates/configs/tiny-swe-grpo.yaml``, one step: the environment made per rollout from the bundled rows (the
    repository found beside the data file from another working directory), the tool loop, ``swe_tests`` logged and a
    checkpoint left. The random policy writes no patch: its reward is 0, as the config says."""
    from launch_kit import launch_tool_default

    _, logged = launch_tool_default("tiny-swe-grpo.yaml", tmp_path)
    assert logged["rewards/swe_tests/mean"] == 0.0 and "tools/call_frequency" in logged, logged


@pytest.mark.parametrize("config, refused", [("tiny-swe-grpo.yaml", "reward_funcs: swe_tests, environment: swe"), ("tiny-search-qa-grpo.yaml", None)])
def test_where_nothing_isolates_the_swe_default_is_refused_and_search_qa_is_not(monkeypatch, config, refused):
    """``swe`` executes the policy's patch (its environment and its reward), so it needs the sandbox's isolation before
    start; ``search_qa`` executes nothing."""
    from halo_core.errors import ConfigError
    from halo_core.methods import grpo
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config, parse_overrides

    monkeypatch.setattr(grpo, "isolation", lambda: None)
    path = Path(__file__).resolve().parents[1] / "templates" / "configs" / config
    run = load_run_config("grpo", grpo.HaloGRPOConfig, path, parse_overrides([]))
    if refused is None:
        check_run(run, 1)
        return
    with pytest.raises(ConfigError, match=f"{refused}: model-written code cannot be isolated"):
        check_run(run, 1)


@pytest.mark.parametrize("mechanism", ["unshare", "bwrap"])
def test_the_repository_is_patched_and_graded_through_each_mechanism(monkeypatch, mechanism):
    """The copy placed in the sandbox's folder is the program's to patch under either mechanism (``unshare`` runs it as
    uid 65534, which must own the files; ``bwrap`` maps the trainer's user)."""
    if not sandbox.works(mechanism):
        pytest.skip(f"{mechanism} does not run here")
    monkeypatch.setattr(sandbox, "isolation", lambda: mechanism)
    command = ROWS[0]["test_command"]
    assert grade(MEAN_FIX, REPO, COMMIT, command, 10.0).passed == 2
    assert grade(PATCHES["a weakened test alone"][0], REPO, COMMIT, command, 10.0).passed == 0
