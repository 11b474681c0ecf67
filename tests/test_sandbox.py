"""The sandbox isolates (issue 47): each escape the issue tried fails, the graders cannot be forged, and a run that
executes model-written code is refused where no isolation works. Every sandbox call here is a fraction of a second."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

from halo_core.rl import sandbox
from halo_core.rl.environments import load_environment
from halo_core.rl.environments.tools import python
from halo_core.rl.rewards import code_tests

TESTS = ["assert add(2, 3) == 5", "assert add(1, 1) == 2"]
HACKS = {
    "os._exit(0)": "import os\nos._exit(0)",
    "raise SystemExit with failing tests": "def add(a, b):\n    return 0\nraise SystemExit",
    "the harness's _report": "import sys\ndef add(a, b):\n    return 0\nfor i in range(2):\n    sys.modules['__main__']._report('pass', i, '')",
    "an __eq__ that always holds": "class Any:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Any()",
    "a forged answer on the grader's pipe": "import os\ndef add(a, b):\n    os.write(1, b'[\"value\", \"5\"]\\n[\"value\", \"2\"]\\n'); os._exit(0)",
}
needs_isolation = pytest.mark.skipif(sandbox.isolation() is None, reason="neither bwrap nor unshare works here (the refusal is tested below)")


@needs_isolation
@pytest.mark.parametrize("hack", sorted(HACKS))
def test_each_grader_hack_scores_zero(hack):
    code = HACKS[hack]
    assert code_tests(None, [code, "def add(a, b):\n    return a + b"], tests=[TESTS, TESTS], timeout_s=3.0) == [0.0, 1.0]
    environment = load_environment("code_contests")()
    environment.reset(tests=TESTS)
    says = environment.run_tests(code)
    assert environment.get_reward() == 0.0 and says.startswith("0/2 tests passed"), says


@needs_isolation
def test_a_test_passes_only_when_it_ran_to_its_end_and_held():
    report = sandbox.run_tests("def add(a, b):\n    return a + b if a != 1 else 0", TESTS + ["x = add(4, 4)\nassert x in (8, 9)", "assert add(0, 0)"],
                               3.0, 256)
    assert (report.passed, report.total) == (2, 4), report.failures
    assert "AssertionError: 0 Eq 2" in report.failures[0] and "test 4" in report.failures[1]


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    yield server.getsockname()[1], accepted
    server.close()


@pytest.mark.parametrize("mechanism", ["unshare", "bwrap"])
def test_the_python_tool_cannot_escape(tmp_path, listener, monkeypatch, mechanism):
    """Each escape the issue found: the host's files, a planted file, the runs, writing outside, the network, root,
    a setsid child outliving the call; through each mechanism that works here."""
    if not sandbox.works(mechanism):
        pytest.skip(f"{mechanism} does not run here")
    monkeypatch.setattr(sandbox, "isolation", lambda: mechanism)
    port, accepted = listener
    planted = tmp_path / "planted.txt"
    planted.write_text("secret")
    marker = tmp_path / "survivor"
    program = f"""
import os, socket, subprocess
def tries(what, f):
    try:
        f(); print(what, "ESCAPED")
    except Exception as e:
        print(what, "blocked", type(e).__name__)
tries("hostname", lambda: open("/etc/hostname").read())
tries("planted", lambda: open({str(planted)!r}).read())
tries("runs", lambda: os.listdir("/work") and os.listdir("/work/runs"))
tries("write", lambda: open({str(tmp_path / 'written')!r}, "w").write("x"))
tries("write_usr", lambda: open("/usr/written", "w").write("x"))
tries("connect", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=1))
print("uid", os.getuid())
open("/sandbox/mine", "w").write("ok")
print("own folder", open("mine").read())
subprocess.Popen(["/bin/sh", "-c", "sleep 1; echo x > {marker}"], start_new_session=True)
"""
    said = python(program)
    assert "ESCAPED" not in said and said.count("blocked") == 6, said
    assert "uid 65534" in said and "own folder ok" in said, said
    assert not (tmp_path / "written").exists() and not accepted
    subprocess.run(["sleep", "1.5"])
    assert not marker.exists(), "a setsid child outlived the call"


@needs_isolation
def test_limits_hold_inside_the_sandbox():
    bomb = "import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            import time; time.sleep(5); os._exit(0)\n        n += 1\nexcept OSError:\n    print('stopped at', n)"
    said = python(bomb)
    assert said.startswith("stopped at") and int(said.split()[-1]) < sandbox.PROCESS_LIMIT, said
    assert "MemoryError" in python("x = bytearray(2 << 30)")
    run = sandbox.run_python("while True: pass", 0.5, 256)
    assert run.timed_out


def test_code_runs_are_refused_without_isolation_unless_allowed(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "isolation", lambda: None)
    monkeypatch.delenv(sandbox.UNISOLATED, raising=False)
    with pytest.raises(sandbox.SandboxError, match="install bubblewrap .* or set sandbox_unisolated: true"):
        python("print(1)")
    monkeypatch.setenv(sandbox.UNISOLATED, "1")
    assert python("print(6 * 7)") == "42"
    assert "WITHOUT isolation" in caplog.text


def test_the_probe_finds_nothing_when_neither_tool_is_on_the_path(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    sandbox.isolation.cache_clear()
    try:
        assert sandbox.isolation() is None
    finally:
        sandbox.isolation.cache_clear()


@pytest.mark.parametrize("fields, refused", [
    ("reward_funcs: [code_tests]\n", "reward_funcs: code_tests"),
    ("reward_funcs: [exact_answer]\ntools: [python]\n", "tools: python"),
    ("environment: code_contests\n", "environment: code_contests"),
    ("reward_funcs: [exact_answer]\ntools: [calculator]\n", None),
    ("reward_funcs: [code_tests]\nsandbox_unisolated: true\n", None),
])
def test_grpo_refuses_code_runs_before_start_where_nothing_isolates(tmp_path, monkeypatch, fields, refused):
    from halo_core.errors import ConfigError
    from halo_core.methods import grpo
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config, parse_overrides
    from launch_kit import write_run

    monkeypatch.setattr(grpo, "isolation", lambda: None)
    run = load_run_config("grpo", grpo.HaloGRPOConfig, write_run(tmp_path, "prompts", fields), parse_overrides([]))
    if refused is None:
        check_run(run, 1)
        return
    with pytest.raises(ConfigError) as caught:
        check_run(run, 1)
    message = str(caught.value)
    assert refused in message and "sandbox_unisolated: true" in message and "\n" not in message, message


@pytest.mark.slow  # a fresh `halo` interpreter loading the stack
def test_the_cli_refuses_with_one_line_and_exit_2(tmp_path):
    """Through ``halo launch --dry-run`` with no isolation on the path: one line, exit 2."""
    from launch_kit import write_run

    config = write_run(tmp_path, "prompts", "reward_funcs: [code_tests]\n")
    done = subprocess.run([sys.executable, "-m", "halo_cli", "launch", "grpo", str(config), "--dry-run"], capture_output=True,
                          text=True, cwd=tmp_path, env={**__import__("os").environ, "PATH": "/nonexistent"})
    assert done.returncode == 2 and "reward_funcs: code_tests: model-written code cannot be isolated" in done.stderr, done.stderr
    assert len([line for line in done.stderr.splitlines() if line.strip()]) == 1
