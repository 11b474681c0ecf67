"""Where sandboxed executions run: a pool on this machine (``execution_backend: local``, the default) or Ray tasks on a
cluster (``execution_backend: ray``, ``ray_address``), the engine verl, OpenRLHF and NeMo-RL already run for this.

Graders and tools hand a module-level function of ``halo_core.rl.sandbox`` (``run_tests``, ``run_python``) and its
arguments to ``run_all`` (a batch, results in order) or ``run_one`` (a tool call). Each execution is its own sandboxed
process either way, so the local pool is threads (``execution_workers`` of them, default the CPUs this process may
use) that start those processes, feed them and read their answers: a batch of completions is graded in parallel
without forking the trainer. Under Ray each execution is a task (one CPU) on whichever node has room, sandboxed there.

State stays where TRL keeps it: an environment instance (``code_contests``) lives with its rollout in the trainer's
process, and only the stateless execution it asks for travels to a worker. An execution whose worker crashes (an
exception in the pool, a Ray worker or node that died) scores 0 for that item alone and is counted in a warning; a
``SandboxError`` (no isolation on that machine, and ``sandbox_unisolated`` off) still ends the run.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from halo_core.errors import ConfigError
from halo_core.rl.sandbox import UNISOLATED, SandboxError

BACKENDS = ("local", "ray")
_log = logging.getLogger(__name__)


def default_workers() -> int:
    """The CPUs this process may run on (its affinity, which a scheduler or container narrows), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Settings:
    backend: str = "local"
    workers: int | None = None  # local: executions at once; None: default_workers()
    ray_address: str | None = None  # ray: ray.init's address; None: RAY_ADDRESS, else a new local instance


def check(backend: str, workers: int | None, ray_address: str | None) -> None:
    """The keys' refusals, before any process starts: one line each, naming the key, the value and the fix."""
    if backend not in BACKENDS:
        raise ConfigError(f"execution_backend: {backend!r} is unknown; use local (a pool on each machine) or ray (Ray tasks, with ray_address)")
    if workers is not None and workers < 1:
        raise ConfigError(f"execution_workers: {workers} must be 1 or more (sandboxed executions at once per process), or empty for "
                          f"the CPUs this process may use ({default_workers()} here)")
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("execution_backend: ray needs the ray package, which is not installed: pip install 'halo-core[rl]' "
                          "(or pip install ray), or use execution_backend: local")
    if workers is not None and backend == "ray":
        raise ConfigError(f"execution_workers: {workers} sizes the local pool, but execution_backend is ray (Ray runs as many tasks at "
                          f"once as its cluster has CPUs); drop execution_workers, or use execution_backend: local")
    if ray_address and backend != "ray":
        raise ConfigError(f"ray_address: {ray_address!r} is set but execution_backend is {backend!r}; set execution_backend: ray, "
                          f"or drop ray_address")


class _Crashed:
    """What a crashed execution leaves in its place (the callers score it 0)."""

    def __init__(self, error: BaseException):
        self.error = error


class _Local:
    def __init__(self, workers: int):
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="halo-sandbox")

    def run_all(self, function: Callable, jobs: list[tuple]) -> list:
        futures = [self.pool.submit(function, *args) for args in jobs]
        results = []
        for future in futures:
            try:
                results.append(future.result())
            except SandboxError:
                raise
            except Exception as exc:
                results.append(_Crashed(exc))
        return results

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _on_ray_worker(function: Callable, args: tuple, unisolated: bool):
    """One execution on a Ray worker: the trainer's ``sandbox_unisolated`` travels with the task."""
    if unisolated:
        os.environ[UNISOLATED] = "1"
    return function(*args)


class _Ray:
    def __init__(self, address: str | None):
        import ray

        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        self.ray = ray
        self.task = ray.remote(num_cpus=1, max_retries=0)(_on_ray_worker)

    def run_all(self, function: Callable, jobs: list[tuple]) -> list:
        unisolated = os.environ.get(UNISOLATED) == "1"
        pending = [self.task.remote(function, args, unisolated) for args in jobs]
        results = []
        for ref in pending:
            try:
                results.append(self.ray.get(ref))
            except self.ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, SandboxError):
                    raise exc.cause from None
                results.append(_Crashed(exc))
            except self.ray.exceptions.RayError as exc:  # the worker or its node died
                results.append(_Crashed(exc))
        return results

    def close(self) -> None:
        pass  # a cluster the run connected to (or started) is Ray's to end at exit


_settings = Settings()
_backend: _Local | _Ray | None = None
_lock = threading.Lock()
crashes = 0  # executions that crashed in this process so far (each scored 0)


def configure(backend: str = "local", workers: int | None = None, ray_address: str | None = None) -> None:
    """The trainer's keys (``grpo``'s ``execution_*``, ``ray_address``); the backend starts at the first execution."""
    global _settings, _backend
    check(backend, workers, ray_address)
    with _lock:
        if _backend is not None:
            _backend.close()
        _settings, _backend = Settings(backend, workers, ray_address), None


def _current() -> _Local | _Ray:
    global _backend
    with _lock:
        if _backend is None:
            if _settings.backend == "ray":
                _backend = _Ray(_settings.ray_address)
            else:
                _backend = _Local(_settings.workers or default_workers())
        return _backend


def run_all(function: Callable, jobs: list[tuple]) -> list:
    """``function(*args)`` for each of ``jobs``, in parallel, results in order; ``None`` where the execution crashed."""
    global crashes
    results = _current().run_all(function, jobs)
    crashed = [r for r in results if isinstance(r, _Crashed)]
    if crashed:
        crashes += len(crashed)
        first = crashed[0].error
        _log.warning("%d of %d sandboxed executions crashed (%s: %s) and scored 0; %d in this process so far", len(crashed), len(results),
                     type(first).__name__, str(first).splitlines()[0][:200] if str(first) else "", crashes)
    return [None if isinstance(r, _Crashed) else r for r in results]


def run_one(function: Callable, *args):
    """One execution (a tool call) through the same backend; ``None`` if it crashed."""
    return run_all(function, [args])[0]
