"""Sandboxed executions beyond one at a time (issue 47, item 4): a batch graded in parallel on this machine's pool,
results in order; a crashed execution scores 0 for its item alone, counted; the same through Ray tasks on a local
Ray instance (two CPUs, about 15 s to start on a 2-core machine); the keys refused before start; and one
``halo launch grpo`` whose code reward runs in the sandbox through the pool."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from halo_core.rl import execution, sandbox
from halo_core.rl.environments import load_environment
from halo_core.rl.rewards import code_tests

TESTS = ["assert add(2, 3) == 5", "assert add(1, 1) == 2"]
RIGHT = "def add(a, b):\n    return a + b"
HACK = "import os\nos._exit(0)"
needs_isolation = pytest.mark.skipif(sandbox.isolation() is None, reason="neither bwrap nor unshare works here (tests/test_sandbox.py)")


@pytest.fixture
def backend():
    """Each test sets its own backend; the default (a local pool of the CPUs) is back afterwards."""
    yield execution.configure
    execution.configure()


@needs_isolation
def test_a_batch_is_graded_in_parallel_and_in_order(backend):
    """Four completions that each take 1.5 s: one after another they take 6 s or more; the pool grades them at once."""
    slow = "import time\ntime.sleep(1.5)\n"
    completions = [slow + RIGHT, slow + HACK, slow + RIGHT, slow + "def add(a, b):\n    return 0"]
    backend("local", workers=4)
    start = time.monotonic()
    rewards = code_tests(None, completions, tests=[TESTS] * 4, timeout_s=8.0)
    took = time.monotonic() - start
    assert rewards == [1.0, 0.0, 1.0, 0.0]
    assert took < 4.5, f"{took:.1f} s: the batch was not graded in parallel"


def _crashing(solution, tests, timeout_s, memory_mb):
    if solution == "crash":
        raise OSError("fork failed")
    return sandbox.run_tests(solution, tests, timeout_s, memory_mb)


@needs_isolation
def test_a_crashed_execution_scores_zero_for_its_item_alone_and_is_counted(backend, monkeypatch, caplog):
    backend("local", workers=2)
    monkeypatch.setattr("halo_core.rl.rewards.run_tests", _crashing)
    before = execution.crashes
    assert code_tests(None, [RIGHT, "crash", RIGHT], tests=[TESTS] * 3, timeout_s=5.0) == [1.0, 0.0, 1.0]
    assert execution.crashes == before + 1
    assert "1 of 3 sandboxed executions crashed (OSError: fork failed) and scored 0" in caplog.text
    monkeypatch.setattr("halo_core.rl.environments.code_contests.run_tests", _crashing)
    environment = load_environment("code_contests")()
    environment.reset(tests=TESTS)
    assert environment.run_tests(RIGHT) == "2/2 tests passed" and environment.get_reward() == 1.0
    assert environment.run_tests("crash") == "0/2 tests passed; the grader's worker crashed" and environment.get_reward() == 0.0
    from halo_core.rl.environments.tools import python

    monkeypatch.setattr("halo_core.rl.environments.tools.run_python", lambda *args: _crashing("crash", *args[1:], None))
    with pytest.raises(RuntimeError, match="the sandbox's worker crashed"):  # TRL hands the model an error result
        python("print(1)")


def test_a_refused_sandbox_still_ends_the_run_through_the_pool(backend, monkeypatch):
    """No isolation and no ``sandbox_unisolated``: not a crash scored 0, the run's error."""
    from halo_core.rl.environments.tools import python

    backend("local", workers=2)
    monkeypatch.setattr(sandbox, "isolation", lambda: None)
    monkeypatch.delenv(sandbox.UNISOLATED, raising=False)
    with pytest.raises(sandbox.SandboxError):
        code_tests(None, [RIGHT], tests=[TESTS], timeout_s=5.0)
    with pytest.raises(sandbox.SandboxError):
        python("print(1)")


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray")  # in the test extra: skips only outside it
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # never a cluster already running here
    yield ray
    ray.shutdown()


@needs_isolation
def test_ray_tasks_grade_in_order_and_a_dead_worker_scores_zero(ray_instance, backend, caplog):
    backend("ray")
    assert execution.run_all(os.getpid, [()])[0] != os.getpid(), "the execution ran in this process, not a Ray worker"
    assert code_tests(None, [RIGHT, HACK, "def add(a, b):\n    return a - b", RIGHT], tests=[TESTS] * 4, timeout_s=10.0) == [1.0, 0.0, 0.0, 1.0]
    environment = load_environment("code_contests")()  # its state stays here; the execution went to Ray
    environment.reset(tests=TESTS + ["assert add(0, 0) == 1"])
    assert environment.run_tests(RIGHT).startswith("2/3 tests passed") and environment.get_reward() == pytest.approx(2 / 3)
    before = execution.crashes
    assert execution.run_all(os._exit, [(1,)]) == [None]  # the worker process dies mid-task
    assert execution.crashes == before + 1 and "1 of 1 sandboxed executions crashed" in caplog.text
    ray_instance.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # _refused travels by value
    with pytest.raises(sandbox.SandboxError, match="cannot be isolated"):  # a node without isolation ends the run
        execution.run_all(_refused, [()])


def _refused():
    raise sandbox.SandboxError(sandbox.REFUSAL)


@pytest.mark.parametrize("fields, says", [
    ("execution_backend: dask\n", "execution_backend: 'dask' is unknown; use local (a pool on each machine) or ray"),
    ("execution_workers: 0\n", "execution_workers: 0 must be 1 or more"),
    ("ray_address: auto\n", "ray_address: 'auto' is set but execution_backend is 'local'; set execution_backend: ray"),
    ("execution_backend: ray\nexecution_workers: 4\n", "execution_workers: 4 sizes the local pool, but execution_backend is ray"),
    ("execution_backend: ray\n", "execution_backend: ray needs the ray package, which is not installed: pip install 'halo-core[rl]'"),
])
def test_bad_execution_keys_are_refused_before_start(tmp_path, monkeypatch, fields, says):
    import importlib.util

    from halo_core.errors import ConfigError
    from halo_core.methods import grpo
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config, parse_overrides
    from launch_kit import write_run

    find_spec = importlib.util.find_spec
    if "needs the ray package" in says:
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a))
    run = load_run_config("grpo", grpo.HaloGRPOConfig, write_run(tmp_path, "prompts", "reward_funcs: [exact_answer]\n" + fields),
                          parse_overrides([]))
    with pytest.raises(ConfigError) as caught:
        check_run(run, 1)
    assert says in str(caught.value) and "\n" not in str(caught.value), caught.value  # the CLI: one line, exit 2 (test_grpo.py)


@needs_isolation
@pytest.mark.slow  # a real halo launch: left out of the fast tier
def test_halo_launch_grpo_grades_code_in_the_sandbox_through_the_pool(tmp_path):
    """One process, three steps: every completion's code (a right solution or ``os._exit(0)``, by its first token)
    graded by ``code_tests`` in the sandbox through a pool of two; the ``python`` tool, run from the same reward,
    cannot read the trainer's files; the run logs the rewards it was given."""
    from launch_kit import launch, logged, write_run

    config = write_run(tmp_path, "prompts", "reward_funcs: [grpo_rewards.code_by_parity]\nexecution_workers: 2\n")
    rows = [json.loads(line) for line in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({**row, "tests": TESTS}) + "\n" for row in rows))
    record = tmp_path / "record"
    out = launch("grpo", config, tmp_path / "out", 1, "--num_generations=2", "--max_completion_length=4", "--optim=sgd",
                 "--learning_rate=0.5", env={"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
                                             "HALO_TEST_RECORD": str(record)})
    calls = [json.loads(line) for line in Path(f"{record}.0").read_text().splitlines()]
    assert len(calls) == 3
    for call in calls:
        assert call["rewards"] == [1.0 if first % 2 == 0 else 0.0 for first in call["first"]], call
        assert call["isolation"] in ("unshare", "bwrap") and "FileNotFoundError" in call["escape"], call  # isolated in the launch
    assert {r for call in calls for r in call["rewards"]} == {0.0, 1.0}, "both a right solution and the hack were graded"
    means = logged(out, "rewards/grpo_rewards.code_by_parity/mean")
    assert means == pytest.approx([sum(call["rewards"]) / len(call["rewards"]) for call in calls])
