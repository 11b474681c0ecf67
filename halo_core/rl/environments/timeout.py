"""A wall-clock limit on every tool call. TRL calls tools inline in its loop, so one that hangs would hang the run;
past the limit the call raises ``TimeoutError``, which TRL's loop hands the model as the tool's ``{"error": ...}``
result and counts in ``tools/failure_frequency``.

A synchronous tool runs in a thread of its own: Python cannot stop a thread, so a timed-out call keeps running in
the background (and may still change its environment's state). A tool that can truly hang should do its work in a
subprocess it can kill, as ``code_contests`` and ``python`` do (``halo_core.rl.sandbox``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
from typing import Callable

DEFAULT_TIMEOUT_S = 30.0
_log = logging.getLogger(__name__)


def _timed_out(name: str, timeout_s: float) -> TimeoutError:
    _log.warning("tool %r timed out after %g s (tool_timeout_s); the model gets an error result and the rollout goes on", name, timeout_s)
    return TimeoutError(f"tool {name!r} timed out after {timeout_s:g} s")


def timed(tool: Callable, timeout_s: float | None) -> Callable:
    """``tool`` under ``timeout_s`` (``None``: as it is), keeping the name, signature and docstring TRL reads."""
    if not timeout_s:
        return tool
    name = getattr(tool, "__name__", repr(tool))
    if inspect.iscoroutinefunction(tool):
        @functools.wraps(tool)
        async def limited_async(*args, **kwargs):
            try:
                return await asyncio.wait_for(tool(*args, **kwargs), timeout_s)
            except TimeoutError:
                raise _timed_out(name, timeout_s) from None

        return limited_async

    @functools.wraps(tool)
    def limited(*args, **kwargs):
        outcome = {}

        def call():
            try:
                outcome["value"] = tool(*args, **kwargs)
            except BaseException as exc:  # handed to the caller's thread below
                outcome["error"] = exc

        worker = threading.Thread(target=call, name=f"halo-tool-{name}", daemon=True)
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():
            raise _timed_out(name, timeout_s)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    return limited


@functools.lru_cache(maxsize=None)
def _timed_class(cls: type, timeout_s: float) -> type:
    """``cls`` with its tool methods (the public ones TRL lists, less ``reset`` and ``get_reward``) timed; same name,
    so TRL logs its reward under it, and no new slots, so an instance's class can be swapped for it."""
    namespace = {"__slots__": (), "__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}
    for attribute, function in inspect.getmembers(cls, predicate=inspect.isfunction):
        if attribute in ("reset", "get_reward") or attribute.startswith("_"):
            continue
        wrapped = timed(function, timeout_s)
        namespace[attribute] = staticmethod(wrapped) if isinstance(inspect.getattr_static(cls, attribute), staticmethod) else wrapped
    return type(cls.__name__, (cls,), namespace)


def timed_environment(factory: Callable, timeout_s: float | None) -> Callable:
    """An environment factory whose instances' tool methods run under ``timeout_s``."""
    if not timeout_s:
        return factory
    if isinstance(factory, type):
        return _timed_class(factory, timeout_s)

    @functools.wraps(factory)
    def make():
        instance = factory()
        instance.__class__ = _timed_class(type(instance), timeout_s)
        return instance

    return make
