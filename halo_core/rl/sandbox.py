"""Model-written Python run isolated by the operating system: what ``code_tests``, ``code_contests`` and ``python`` share.

Each run is a fresh ``python -I`` inside Linux namespaces, through bubblewrap (``bwrap``) when it works here, else
util-linux's ``unshare`` (as root): no network (a new network namespace), a private empty folder (``/sandbox``)
as the only writable path, a read-only view of just ``/usr`` (and its ``/bin``, ``/lib`` links), the
interpreter's prefixes and its site-packages (no ``/etc``, ``/home``, ``/root``, ``/tmp`` or ``/work`` of the
host), uid 65534 (nobody) with no capabilities, and a PID namespace whose end kills everything left in it, a
``setsid`` child included. Limits inside: ``RLIMIT_AS`` (memory), ``RLIMIT_FSIZE`` (1 MiB a file),
``RLIMIT_NPROC`` (processes), and a wall-clock timeout. Where neither mechanism works, ``isolation()`` is
``None`` and a run that executes model-written code is refused before start unless ``sandbox_unisolated: true``.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import logging
import operator
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from halo_core.errors import HaloError

OUTPUT_LIMIT = 1 << 20  # bytes a run may write to any one file, and a grader's answer may take
PROCESS_LIMIT = 64  # RLIMIT_NPROC: a fork bomb stops here
NOBODY = 65534
UNISOLATED = "HALO_SANDBOX_UNISOLATED"  # set by ``sandbox_unisolated: true``: run without isolation, logged each time
_log = logging.getLogger(__name__)


class SandboxError(HaloError):
    """Model-written code asked to run where no isolation works and the user did not allow running it unisolated."""


REFUSAL = ("model-written code cannot be isolated here: neither bubblewrap (bwrap) nor util-linux unshare as root can create "
           "the namespaces; install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or set sandbox_unisolated: true "
           "to run it without isolation (logged every time)")


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
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({OUTPUT_LIMIT}, {OUTPUT_LIMIT}))\n"
            f"resource.setrlimit(resource.RLIMIT_NPROC, ({PROCESS_LIMIT}, {PROCESS_LIMIT}))\n"
            "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
            "del resource\n")


def _visible() -> list[str]:
    """What the sandbox sees, read-only: ``/usr`` and its links, the interpreter's prefixes, its site-packages."""
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", sys.base_prefix, sys.prefix,
             sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    seen = []
    for path in paths:
        if os.path.lexists(path) and path not in seen and not any(path.startswith(p.rstrip("/") + "/") for p in seen if not os.path.islink(p)):
            seen.append(path)
    return seen


def _unshare_command(root: str, folder: str, program: list[str]) -> list[str]:
    """Root only: new mount, network, PID, IPC and UTS namespaces; a tmpfs root holding read-only binds and the folder;
    ``pivot_root`` drops the host's tree; the program runs as uid 65534 with no capabilities. ``sh`` stays PID 1, so
    its end (the program's, or a kill) ends every process of the namespace."""
    q = shlex.quote
    lines = ["set -e", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"mount -t tmpfs -o mode=755,size=8m none {q(root)}"]
    for path in _visible():
        inside = q(root + path)
        if os.path.islink(path):
            lines.append(f"mkdir -p {q(os.path.dirname(root + path))} && ln -s {q(os.readlink(path))} {inside}")
        else:
            lines += [f"mkdir -p {inside}", f"mount --bind {q(path)} {inside}", f"mount -o remount,bind,ro,nosuid,nodev {inside}"]
    lines.append(f"mkdir -p {q(root)}/dev {q(root)}/proc {q(root)}/sandbox")
    for device in ("null", "zero", "random", "urandom"):
        lines += [f"touch {q(root)}/dev/{device}", f"mount --bind /dev/{device} {q(root)}/dev/{device}"]
    lines += [f"mount --bind {q(folder)} {q(root)}/sandbox", f"mount -t proc -o nosuid,nodev,noexec proc {q(root)}/proc || true",
              "hostname sandbox 2>/dev/null || true",
              f"cd {q(root)} && mkdir .old && pivot_root . .old && umount -l /.old && rmdir /.old && cd /sandbox || exit 125",
              "set +e",
              f"setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups --no-new-privs --bounding-set=-all --inh-caps=-all -- \"$@\"",
              "exit $?"]
    return [shutil.which("unshare") or "unshare", "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--",
            "/bin/sh", "-c", "\n".join(lines), "sh", *program]


def _bwrap_command(root: str, folder: str, program: list[str]) -> list[str]:
    """bubblewrap (its own user namespace, so any user): the same view, uid 65534, no capabilities."""
    command = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
               "--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox"]
    for path in _visible():
        command += ["--symlink", os.readlink(path), path] if os.path.islink(path) else ["--ro-bind", path, path]
    return command + ["--proc", "/proc", "--dev", "/dev", "--bind", folder, "/sandbox", "--chdir", "/sandbox", "--", *program]


_COMMANDS = {"unshare": _unshare_command, "bwrap": _bwrap_command}


def _candidates() -> list[str]:
    """Root: ``unshare`` first (the program's real uid becomes 65534, which ``RLIMIT_NPROC`` counts; bwrap would keep
    root's, which it exempts), then bwrap. Other users: bwrap."""
    return (["unshare", "bwrap"] if os.geteuid() == 0 else ["bwrap"])


def works(name: str) -> bool:
    """Whether ``name`` (``unshare`` or ``bwrap``) runs a program here as uid 65534."""
    if not shutil.which(name):
        return False
    try:
        run = _run(name, "import os; print(os.getuid())", 20.0, 256, {}, ())
    except OSError:
        return False
    return run.returncode == 0 and run.stdout.strip() == str(NOBODY)


@functools.lru_cache(maxsize=None)
def isolation() -> str | None:
    """The first mechanism that works here (tried once per process), else None."""
    return next((name for name in _candidates() if works(name)), None)


def executes_code(function):
    """Marks a reward, tool or environment that runs model-written code: a run using one needs ``isolation()``."""
    function.executes_code = True
    return function


def _mechanism() -> str | None:
    name = isolation()
    if name is None:
        if os.environ.get(UNISOLATED) != "1":
            raise SandboxError(REFUSAL)
        _log.warning("running model-written code WITHOUT isolation (sandbox_unisolated: true): it can read, write and connect "
                     "wherever the trainer's user can")
    return name


def _place(folder: Path, files: dict[str, bytes], owner: int | None) -> None:
    """``files`` (relative path -> bytes) written into the private folder before the program starts (a repository the
    program works on), owned by the program's user so it may change them."""
    for name, data in files.items():
        path = folder / name
        if Path(name).is_absolute() or ".." in Path(name).parts or not path.resolve().is_relative_to(folder.resolve()):
            raise ValueError(f"sandbox file {name!r} is not a relative path inside the sandbox's folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    if owner is not None:
        for path in folder.rglob("*"):
            os.chown(path, owner, owner, follow_symlinks=False)


@contextlib.contextmanager
def _started(name: str | None, program: str, memory_mb: int, env: dict | None, stdin, stdout, stderr, files: dict | None = None):
    """The program's process in a fresh private folder (holding ``files``), killed with everything it started when the
    block ends."""
    with tempfile.TemporaryDirectory(prefix="halo-sandbox-") as place:
        folder, root = Path(place, "sandbox"), Path(place, "root")
        folder.mkdir()
        root.mkdir()
        _place(folder, files or {}, NOBODY if name == "unshare" else None)
        if name == "unshare":
            os.chown(folder, NOBODY, NOBODY)
        command = [sys.executable, "-I", "-c", _limits(memory_mb) + program]
        if name is not None:
            command = _COMMANDS[name](str(root), str(folder), command)
        child = subprocess.Popen(command, cwd=folder, stdin=stdin, stdout=stdout(place), stderr=stderr(place),
                                 env={"PATH": os.defpath, "HOME": "/sandbox", "TMPDIR": "/sandbox", **(env or {})}, start_new_session=True)
        try:
            yield child, folder, place
        finally:
            with contextlib.suppress(ProcessLookupError):  # the whole group: sh (PID 1 of the namespace) or bwrap
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def _run(name, program, timeout_s, memory_mb, env, keep, given=None) -> Run:
    files = lambda place, which: open(Path(place, which), "wb")  # noqa: E731
    with _started(name, program, memory_mb, env, subprocess.DEVNULL, lambda p: files(p, ".stdout"), lambda p: files(p, ".stderr"),
                  given) as (child, folder, place):
        try:
            returncode = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            returncode = None
        read = lambda path: path.read_text(errors="replace") if path.exists() else ""  # noqa: E731
        return Run(returncode, read(Path(place, ".stdout")), read(Path(place, ".stderr")), {k: read(folder / k) for k in keep})


def run_python(program: str, timeout_s: float, memory_mb: int, env: dict | None = None, keep: tuple[str, ...] = (),
               files: dict[str, bytes] | None = None) -> Run:
    """``program`` run isolated under the limits above; ``files``: relative path -> bytes placed in its folder first;
    ``keep``: files of its folder to read back."""
    return _run(_mechanism(), program, timeout_s, memory_mb, env, keep, files)


# The solution's own process: it runs the solution, then answers the grader's requests one JSON line each on the
# pipe it was started with (what the solution prints goes to a file). It never sees a test whole: only the parts
# the grader asks it to evaluate, never an expected value, and its answers are data the grader compares itself.
_WORKER = """
import json as _json, os as _os
_rx, _tx = _os.fdopen(_os.dup(0), "r"), _os.fdopen(_os.dup(1), "w")
_os.dup2(_os.open(_os.devnull, _os.O_RDONLY), 0)
_out = _os.open(".output", _os.O_WRONLY | _os.O_CREAT | _os.O_TRUNC)
_os.dup2(_out, 1); _os.dup2(_out, 2)
def _answer(kind, text):
    _tx.write(_json.dumps([kind, text]) + "\\n"); _tx.flush()
_ns = {"__name__": "__main__"}
try:
    exec(compile(SOLUTION, "solution.py", "exec"), _ns)
    _answer("ok", "")
except BaseException as e:
    _answer("error", f"{type(e).__name__}: {e}"[:300]); raise SystemExit(1)
for _line in _rx:
    _mode, _source = _json.loads(_line)
    try:
        if _mode == "exec":
            exec(compile(_source, "test", "exec"), _ns); _answer("ok", "")
        else:
            _answer("value", repr(eval(compile(_source, "test", "eval"), _ns)))
    except BaseException as e:
        _answer("error", f"{type(e).__name__}: {e}"[:300])
"""

_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
            ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not, ast.In: lambda a, b: a in b,
            ast.NotIn: lambda a, b: a not in b}


class _Failed(Exception):
    pass


class _Worker:
    """The grader's side of the solution's process: requests out, data back, the deadline kept."""

    def __init__(self, child, deadline: float):
        self.child, self.deadline, self.buffer = child, deadline, b""

    def ask(self, mode: str, source: str):
        try:
            self.child.stdin.write((json.dumps([mode, source]) + "\n").encode())
            self.child.stdin.flush()
        except OSError:
            raise _Failed("the program had ended") from None
        kind, text = self.answer()
        if kind == "error":
            raise _Failed(text)
        if mode == "eval":
            try:
                return ast.literal_eval(text)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                raise _Failed(f"{source[:80]} gave {text[:80]}, not plain data (numbers, strings, None, lists, tuples, "
                              "dicts, sets) the grader can compare outside the solution") from None

    def answer(self) -> tuple[str, str]:
        fd = self.child.stdout.fileno()
        while b"\n" not in self.buffer:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if len(self.buffer) > OUTPUT_LIMIT:
                raise _Failed("an answer over 1 MiB")
            if not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.child.wait(timeout=1.0)
                raise _Failed(f"the program ended (exit code {self.child.returncode})")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            kind, text = json.loads(line)
            assert kind in ("ok", "error", "value") and isinstance(text, str)
        except Exception:
            raise _Failed("a malformed answer") from None
        return kind, text


def _grade(test: str, worker: _Worker) -> None:
    """Raises ``_Failed`` unless ``test`` ran to its end and held. Its statements run in the solution's process, but
    each ``assert`` among them (at the test's top level) is decided here: each side of a comparison (or the whole
    condition) not a literal is evaluated there and comes back as data, the comparison made here, so a forged exit,
    record or ``__eq__`` passes nothing."""
    try:
        statements = ast.parse(test).body
    except (SyntaxError, ValueError) as exc:
        raise _Failed(f"the test does not parse: {exc}") from None
    if not statements:
        raise _Failed("the test is empty")
    for statement in statements:
        if isinstance(statement, ast.Assert):
            _decide(statement, worker)
        else:
            worker.ask("exec", ast.unparse(statement))


def _decide(last: ast.Assert, worker: _Worker) -> None:
    """One ``assert``, decided in the grader from the data its sides evaluate to in the solution's process."""

    def value(node):
        try:
            return ast.literal_eval(node)
        except ValueError:
            return worker.ask("eval", ast.unparse(node))

    check = last.test
    if isinstance(check, ast.Compare) and all(type(op) in _COMPARE for op in check.ops):
        left = value(check.left)
        for op, node in zip(check.ops, check.comparators):
            right = value(node)
            try:
                held = _COMPARE[type(op)](left, right)
            except Exception as exc:
                raise _Failed(f"{type(exc).__name__}: {exc}"[:300]) from None
            if not held:
                raise _Failed(f"AssertionError: {left!r:.80} {type(op).__name__} {right!r:.80}")
            left = right
    elif not value(check):
        raise _Failed("AssertionError")


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


def run_tests(solution: str, tests: list[str], timeout_s: float, memory_mb: int, files: dict[str, bytes] | None = None) -> TestReport:
    """``solution`` in the sandbox, then each of ``tests`` (statements, e.g. ``assert f(2) == 4``) graded from
    outside it (``_grade``): a test passes only when the grader saw it run to its end and hold. Tests not reached
    before a timeout or the program's end count as failed. ``files`` (relative path -> bytes) are placed in the
    sandbox's folder, the solution's working directory, before it starts."""
    program = f"SOLUTION = {solution!r}\n" + _WORKER
    name = _mechanism()
    passed, failures, timed_out = 0, [], False
    with _started(name, program, memory_mb, None, subprocess.PIPE, lambda p: subprocess.PIPE, lambda p: subprocess.DEVNULL,
                  files) as (child, _, _):
        worker = _Worker(child, time.monotonic() + timeout_s)
        try:
            kind, text = worker.answer()
            if kind != "ok":
                raise _Failed(f"solution raised {text}")
        except TimeoutError:
            return TestReport(0, len(tests), [], True)
        except _Failed as exc:
            return TestReport(0, len(tests), [str(exc).replace("the program ended", "the program ended before any test ran")], False)
        for index, test in enumerate(tests):
            try:
                _grade(test, worker)
                passed += 1
            except TimeoutError:
                timed_out = True
                break
            except _Failed as exc:
                failures.append(f"test {index + 1} ({test[:80]}): {exc}")
    return TestReport(passed, len(tests), failures, timed_out)
