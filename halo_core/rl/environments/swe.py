"""``swe``: a repository task. The policy reads a local git repository at a base commit and answers with a patch
(a unified diff); the patch is applied inside the sandbox on a copy of the repository, and the repository's own
tests grade it there, each ``assert`` decided outside the patched code's process (``halo_core.rl.sandbox``).

Rows carry ``prompt`` (the problem statement), ``repo`` (a git repository: a folder, or a file ``git bundle``
wrote; a JSON source's relative path is taken from its file's folder), ``base_commit`` and ``test_command`` (the
tests, as a pytest command line: ``pytest tests/test_x.py[::test_name] ...``). Halo does not run pytest (its
verdicts would live in the process the patch controls): it collects the named files' module-level ``test_*``
functions from the base commit and grades each one statement by statement.

The environment's tools: ``read_file(path)`` (a file of the base commit) and ``run_tests(patch)`` (the grader, its
outcome told to the model). The final answer's patch is scored by the ``swe_tests`` reward: 1.0 when the patch
applies, leaves every test file as the base commit has it, and every named test runs to its end and holds.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import io
import os
import re
import shlex
import subprocess
import tarfile
import tempfile
from pathlib import Path

from halo_core.rl.sandbox import TestReport, executes_code, run_tests

_DIFF = re.compile(r"```(?:diff|patch)?[ \t]*\n(.*?)```", re.S)
_GIT = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}


def _git(*args: str, cwd: str | None = None) -> bytes:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, env={**os.environ, **_GIT}, timeout=120)
    if done.returncode:
        raise ValueError(f"git {' '.join(args[:2])} failed: {done.stderr.decode(errors='replace').strip()[:300]}")
    return done.stdout


@functools.lru_cache(maxsize=32)
def _files_at(repo: str, commit: str, stamp: float) -> dict[str, bytes]:
    """The tracked files of ``repo`` at ``commit`` (``stamp``: the repository's mtime, so a changed one is read again).
    Read by git outside the sandbox: the repository is the dataset's, not the policy's."""
    with tempfile.TemporaryDirectory(prefix="halo-swe-") as clone:
        _git("clone", "--quiet", "--bare", "--no-hardlinks", repo, clone)
        archive = _git("archive", "--format=tar", commit, cwd=clone)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {member.name: tar.extractfile(member).read() for member in tar.getmembers() if member.isfile()}


def base_files(repo: str, commit: str) -> dict[str, bytes]:
    """The repository's files at the base commit; a clear error for a row that names neither."""
    if not repo or not Path(repo).exists():
        raise ValueError(f"environment 'swe': repo {repo!r} is not a git repository folder or bundle file here")
    if not commit:
        raise ValueError("environment 'swe' needs a 'base_commit' column (the commit the patch applies to)")
    return _files_at(str(Path(repo).resolve()), str(commit), Path(repo).stat().st_mtime)


def is_test_file(path: str) -> bool:
    """pytest's conventions: ``test_*.py``, ``*_test.py``, ``conftest.py``, or anything under a ``test``/``tests`` folder.
    Plain string work: the sandbox's prelude runs this very source."""
    *folders, name = path.split("/")
    return (name.startswith("test_") and name.endswith(".py")) or name.endswith("_test.py") or name == "conftest.py" \
        or any(folder in ("test", "tests") for folder in folders)


def selected_tests(test_command: str, files: dict[str, bytes]) -> dict[str, list[str]]:
    """The test files and function names a pytest command line names (``[]``: every ``test_*`` function of the file)."""
    words = shlex.split(str(test_command or ""))
    while words and (words[0] in ("python", "python3", "-m") or words[0].endswith(("pytest", "py.test"))):
        words.pop(0)
    chosen: dict[str, list[str]] = {}
    for word in words:
        if word.startswith("-"):
            continue
        path, _, name = word.partition("::")
        path = path.strip("/").removeprefix("./")
        matched = [f for f in files if f == path or (f.startswith(path + "/") and is_test_file(f) and f.endswith(".py"))]
        if not matched:
            raise ValueError(f"environment 'swe': test_command {test_command!r} names {path!r}, which the base commit does not hold")
        for file in matched:
            names = chosen.setdefault(file, [])
            if name:
                names.append(name)
    if not chosen:
        raise ValueError(f"environment 'swe': test_command {test_command!r} names no test file; write it as pytest tests/test_x.py")
    return chosen


def _test_bodies(source: str, names: list[str], file: str) -> list[tuple[str, str]]:
    """``(id, statements)`` of each module-level ``test_*`` function chosen; one with parameters (pytest fixtures) or
    ``async``, or a name the file does not define, becomes a test that fails saying so."""
    tests = []
    for node in ast.parse(source).body:
        if not (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")):
            continue
        if names and node.name not in names:
            continue
        ident = f"{file}::{node.name}"
        arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        if isinstance(node, ast.AsyncFunctionDef) or arguments or node.args.vararg or node.args.kwarg:
            tests.append((ident, "raise TypeError('async tests and pytest fixtures are not supported by the grader')"))
        else:
            tests.append((ident, "\n".join(ast.unparse(statement) for statement in node.body)))
    found = {ident.rpartition("::")[2] for ident, _ in tests}
    tests += [(f"{file}::{name}", f"raise LookupError({f'{file} has no module-level test function {name!r}'!r})") for name in names if name not in found]
    return tests


# Runs inside the sandbox before any of the patched code: applies the patch with git, checks that no test file changed
# (by its SHA-256: the program travels as an argument, so it carries no file bodies) or appeared, then imports the test
# module, unchanged from the base commit (the patched code's first run). Raising fails every test.
_PRELUDE = """
import hashlib as _hashlib, os as _os, subprocess as _subprocess, sys as _sys
_env = {"PATH": "/usr/bin:/bin", "HOME": _os.getcwd(), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": _os.devnull}
_done = _subprocess.run(["git", "apply", "--whitespace=nowarn", "../patch.diff"], cwd="repo", env=_env,
                        capture_output=True, text=True)
if _done.returncode:
    raise RuntimeError("the patch does not apply: " + (_done.stderr.strip().splitlines() or ["git apply failed"])[-1])
for _path, _digest in TEST_FILES.items():
    _here = _os.path.join("repo", _path)
    if not _os.path.isfile(_here) or _hashlib.sha256(open(_here, "rb").read()).hexdigest() != _digest:
        raise RuntimeError("the patch changes the test file " + _path)
for _folder, _dirs, _names in _os.walk("repo"):
    for _name in _names:
        _path = _os.path.relpath(_os.path.join(_folder, _name), "repo").replace(_os.sep, "/")
        if is_test_file(_path) and _path not in TEST_FILES:
            raise RuntimeError("the patch adds the test file " + _path)
_os.chdir("repo")
_sys.path.insert(0, _os.getcwd())
del _hashlib, _os, _subprocess, _sys, _env, _done
exec(compile(open(TEST_NAME, "rb").read(), TEST_NAME, "exec"), globals())
"""


def grade(patch: str, repo: str, base_commit: str, test_command: str, timeout_s: float = 20.0, memory_mb: int = 512) -> TestReport:
    """``patch`` applied in the sandbox on a copy of the repository at ``base_commit``, then the tests ``test_command``
    names, one sandboxed process per test file, every top-level ``assert`` decided by the grader. A patch that does not
    apply, or that touches a test file, fails every test."""
    files = base_files(repo, base_commit)
    chosen = selected_tests(test_command, files)
    tests_of_base = {path: hashlib.sha256(data).hexdigest() for path, data in files.items() if is_test_file(path)}
    placed = {f"repo/{path}": data for path, data in files.items()} | {"patch.diff": patch.encode()}
    passed, total, failures, timed_out = 0, 0, [], False
    for file, names in chosen.items():
        source = files[file].decode()
        tests = _test_bodies(source, names, file)
        prelude = "\n".join([f"TEST_FILES = {tests_of_base!r}", f"TEST_NAME = {file!r}",
                             inspect.getsource(is_test_file), _PRELUDE])
        report = run_tests(prelude, [body for _, body in tests], timeout_s, memory_mb, files=placed)
        passed += report.passed
        total += report.total
        timed_out |= report.timed_out
        failures += [f"{file}: {failure}" for failure in report.failures]
    return TestReport(passed, total, failures, timed_out)


def patch_of(completion) -> str | None:
    """The patch in a completion: its final message's last fenced ``diff`` block, else its text from the first
    ``diff --git`` or ``--- `` line; ``None`` when it holds none."""
    answer = completion if isinstance(completion, str) else next(
        (m.get("content") or "" for m in reversed(completion) if m.get("role", "assistant") == "assistant" and m.get("content")), "")
    blocks = [b for b in _DIFF.findall(answer) if "@@" in b]
    if blocks:
        return blocks[-1]
    start = re.search(r"^(diff --git |--- )", answer, re.M)
    return answer[start.start():].rstrip("`\n ") + "\n" if start and "@@" in answer[start.start():] else None


@executes_code
def swe_tests(prompts, completions, repo, base_commit, test_command, timeout_s: float = 20.0, memory_mb: int = 512,
              **kwargs) -> list[float]:
    """1.0 when the completion's patch applies, leaves the tests alone and every named test runs to its end and holds."""
    rewards = []
    for completion, where, commit, command in zip(completions, repo, base_commit, test_command):
        patch = patch_of(completion)
        report = grade(patch, where, commit, command, timeout_s, memory_mb) if patch else None
        rewards.append(1.0 if report and report.total and report.passed == report.total else 0.0)
    return rewards


@executes_code
class SWE:
    """One rollout's repository task; subclass it to change the limits."""

    timeout_s = 20.0
    memory_mb = 512

    def reset(self, repo=None, base_commit=None, test_command=None, **row) -> str:
        self._files = base_files(repo, base_commit)
        selected_tests(test_command, self._files)  # a row naming no test is refused at its first rollout
        self._where = (repo, base_commit, test_command)
        listing = "\n".join(sorted(self._files))
        return (f"The repository's files:\n{listing}\nAnswer with a unified diff (```diff ... ```) that fixes the problem "
                f"without changing the tests.")

    def read_file(self, path: str) -> str:
        """Read a file of the repository.

        Args:
            path: The file's path in the repository, e.g. "src/module.py".

        Returns:
            The file's text.
        """
        data = self._files.get(str(path).strip().strip("/").removeprefix("./"))
        if data is None:
            raise FileNotFoundError(f"no file {path!r} in the repository")
        return data.decode(errors="replace")[:8000]

    def run_tests(self, patch: str) -> str:
        """Apply a patch to a copy of the repository and run its tests.

        Args:
            patch: A unified diff against the repository (paths as a/... and b/...).

        Returns:
            How many tests passed, and the first failure.
        """
        return grade(patch_of(patch) or patch, *self._where, self.timeout_s, self.memory_mb).summary(self.timeout_s)
