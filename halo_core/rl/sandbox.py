"""Model-written Python run in a fresh ``python -I`` subprocess: what ``code_tests`` and ``code_contests`` share.

Each run gets an empty temporary folder as its working directory, no stdin, an environment holding nothing of
the trainer's (no tokens or keys), an address-space limit (``RLIMIT_AS``), a cap on what it may write
(``RLIMIT_FSIZE``: its output goes to files, so a print loop cannot fill the trainer's memory) and a wall-clock
timeout after which its whole process group is killed. This bounds resources; it is not a security boundary
against code that sets out to escape (no network or file-system isolation).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

OUTPUT_LIMIT = 1 << 20  # bytes a run may write to any one file


@dataclass
class Run:
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    files: dict = field(default_factory=dict)  # name -> text of the files asked for (``keep``) that the run left

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def _limits(memory_mb: int) -> str:
    return ("import resource\n"
            f"resource.setrlimit(resource.RLIMIT_AS, ({memory_mb << 20}, {memory_mb << 20}))\n"
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({OUTPUT_LIMIT}, {OUTPUT_LIMIT}))\n")


def run_python(program: str, timeout_s: float, memory_mb: int, env: dict | None = None, keep: tuple[str, ...] = ()) -> Run:
    """``program`` run under the limits above; ``keep``: files of its folder to read back."""
    with tempfile.TemporaryDirectory() as folder:
        out, err = Path(folder, ".stdout"), Path(folder, ".stderr")
        with out.open("wb") as stdout, err.open("wb") as stderr:
            child = subprocess.Popen([sys.executable, "-I", "-c", _limits(memory_mb) + program], cwd=folder, stdin=subprocess.DEVNULL,
                                     stdout=stdout, stderr=stderr, env={"PATH": os.defpath, **(env or {})}, start_new_session=True)
            try:
                returncode = child.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                try:  # the whole group: a child's own children too
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                child.wait()
        read = lambda path: path.read_text(errors="replace") if path.exists() else ""  # noqa: E731
        return Run(returncode, read(out), read(err), {name: read(Path(folder, name)) for name in keep})


# Runs the solution, then each test in its namespace, writing one JSON line per outcome to a file of its own (what
# the solution prints cannot pass for a result), each behind a mark the solution is not shown (a file it writes
# itself cannot either, by accident).
_HARNESS = """
import json as _json, os as _os
_mark = _os.environ.pop("HALO_MARK")
_fd = _os.open(".results", _os.O_WRONLY | _os.O_CREAT | _os.O_APPEND)
def _report(*record):
    _os.write(_fd, (_mark + _json.dumps(record) + "\\n").encode())
_ns = {"__name__": "__main__"}
try:
    exec(compile(SOLUTION, "solution.py", "exec"), _ns)
except BaseException as e:
    _report("error", -1, f"{type(e).__name__}: {e}"[:300])
    raise SystemExit(1)
for _i, _test in enumerate(TESTS):
    try:
        exec(compile(_test, f"test {_i + 1}", "exec"), _ns)
        _report("pass", _i, "")
    except BaseException as e:
        _report("fail", _i, f"{type(e).__name__}: {e}"[:300])
"""


@dataclass
class TestReport:
    passed: int
    total: int
    failures: list[str]  # "test 2 (assert f(2) == 4): AssertionError: ..." or the solution's own error
    timed_out: bool

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def summary(self, timeout_s: float) -> str:
        """What a tool hands back to the model: the count, and the first failure."""
        line = f"{self.passed}/{self.total} tests passed"
        if self.timed_out:
            line += f"; timed out after {timeout_s:g} s"
        if self.failures:
            line += f"; {self.failures[0]}"
        return line[:500]


def run_tests(solution: str, tests: list[str], timeout_s: float, memory_mb: int) -> TestReport:
    """``solution``, then each of ``tests`` (statements, e.g. ``assert f(2) == 4``): how many pass. Tests that
    did not run before a timeout or a crash count as failed."""
    mark = secrets.token_hex(8)
    program = f"SOLUTION = {solution!r}\nTESTS = {list(tests)!r}\n" + _HARNESS
    run = run_python(program, timeout_s, memory_mb, env={"HALO_MARK": mark}, keep=(".results",))
    records = []
    for line in run.files[".results"].splitlines():
        if line.startswith(mark):
            try:
                records.append(json.loads(line[len(mark):]))
            except ValueError:
                pass
    passed = {index for kind, index, _ in records if kind == "pass"}
    failures = [f"solution raised {message}" if kind == "error" else f"test {index + 1} ({tests[index][:80]}): {message}"
                for kind, index, message in records if kind != "pass"]
    if not records and not run.timed_out:  # died before reporting: a memory or output limit, a signal, os._exit
        failures.append(f"the program exited with code {run.returncode} before any test ran: {run.stderr.strip()[-200:]}")
    return TestReport(len(passed), len(tests), failures, run.timed_out)
