"""Multi-turn environments and tools for ``grpo``, by name: what TRL's ``GRPOTrainer`` takes as ``environment_factory``
and ``tools``. TRL runs the loop (tool-call parsing, the tool turns' tokens spliced in with no loss, the training
chat template for templates that re-render earlier turns); Halo adds the names and a timeout on every call.

- ``environment: NAME``: the ``halo.environments`` entry point ``NAME``, else a dotted import path, to a factory
  (usually a class) of instances with ``reset(**row)`` (the dataset row; may return text appended to the last user
  message), public methods the model may call (type hints and a Google-style docstring: their JSON schema is the
  prompt's tool list) and, optionally, ``get_reward() -> float`` (then a reward source of its own, weight 1, logged
  under the class's name). One instance per rollout.
- ``tools: [NAME, ...]``: each a ``halo.tools`` entry point, else a dotted path, to a plain function with the same
  requirements, shared by every rollout (TRL's ``tools``); graded by ``reward_funcs``.
- ``tool_timeout_s``: every call, an environment's methods included, is cut off there and answered with an error.
- ``environment_kwargs``: keyword arguments of the factory (``mcp``'s ``server``), bound by Halo since TRL calls the
  factory with none.
"""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import entry_points
from typing import Callable

from halo_core.errors import ConfigError
from halo_core.rl.environments.timeout import DEFAULT_TIMEOUT_S, timed, timed_environment

ENVIRONMENTS = "halo.environments"
TOOLS = "halo.tools"


def known(group: str) -> list[str]:
    return sorted(ep.name for ep in entry_points(group=group))


def _resolve(key: str, group: str, name: str, example: str):
    found = {ep.name: ep for ep in entry_points(group=group)}
    if name in found:
        try:
            return found[name].load()
        except ImportError as exc:  # a library it needs is missing: the error says which and how to install it
            raise ConfigError(f"{key}: {name!r} cannot be loaded: {exc}") from None
    module, _, attribute = name.rpartition(".")
    why = ""
    if module:
        try:
            value = getattr(importlib.import_module(module), attribute, None)
        except ImportError as exc:
            value, why = None, f" (importing {module!r} failed: {exc})"
        if callable(value):
            return value
    raise ConfigError(f"{key}: {name!r} is unknown{why}; installed: {known(group) or 'none'}, or a dotted import path ({example}) "
                      f"importable on every rank; a package declares its own in the {group!r} entry-point group of its pyproject.toml")


def _schema(key: str, name: str, function: Callable) -> None:
    """The JSON schema the prompt will list, built now: a missing type hint or docstring is refused before start."""
    from transformers.utils import get_json_schema

    try:
        get_json_schema(function)
    except Exception as exc:
        raise ConfigError(f"{key}: {name!r} cannot be offered to the model ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
                          f"give every argument a type hint and the function a Google-style docstring with an Args: section") from None


def load_tools(names: list[str], timeout_s: float | None = DEFAULT_TIMEOUT_S) -> list[Callable]:
    """TRL's ``tools``: the named functions, each cut off at ``timeout_s``."""
    tools = []
    for name in names:
        function = _resolve("tools", TOOLS, name, "my_lib.tools.search")
        _schema("tools", name, function)
        tools.append(timed(function, timeout_s))
    return tools


def _bound(factory: Callable, name: str, kwargs: dict) -> Callable:
    """``factory`` called with ``kwargs`` (``environment_kwargs``), refused before start where it names no such arguments."""
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"environment_kwargs: {kwargs!r} do not fit environment {name!r} ({exc}); give only the arguments "
                          f"its factory takes: {inspect.signature(factory)}") from None

    def make():
        return factory(**kwargs)

    make.__name__ = make.__qualname__ = getattr(factory, "__name__", name)
    return make


def load_environment(name: str, timeout_s: float | None = DEFAULT_TIMEOUT_S, kwargs: dict | None = None) -> Callable:
    """TRL's ``environment_factory``: the named factory (called with ``kwargs``), its instances' tool methods cut off at
    ``timeout_s``."""
    factory = _resolve("environment", ENVIRONMENTS, name, "my_lib.envs.Maze")
    if kwargs:
        factory = _bound(factory, name, kwargs)
    if isinstance(factory, type):
        if not callable(getattr(factory, "reset", None)):
            raise ConfigError(f"environment: {name!r} has no reset method; TRL calls reset(**row) at the start of every rollout")
        for attribute, function in inspect.getmembers(factory, predicate=inspect.isfunction):
            if attribute not in ("reset", "get_reward") and not attribute.startswith("_"):
                _schema("environment", f"{name}.{attribute}", function)
    return timed_environment(factory, timeout_s)


def check_tools(args) -> None:
    """What ``grpo``'s pre-start check refuses: names that resolve to nothing, tools the prompt cannot list."""
    timeout = getattr(args, "tool_timeout_s", DEFAULT_TIMEOUT_S)
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"tool_timeout_s={timeout} must be above 0 (seconds a tool call may take), or empty for no limit")
    if args.tools:
        load_tools(args.tools, timeout)
    kwargs = getattr(args, "environment_kwargs", None) or {}
    if kwargs and not args.environment:
        raise ConfigError(f"environment_kwargs: {kwargs!r} is set but no environment is; name one (environment: mcp) or drop it")
    if args.environment:
        factory = load_environment(args.environment, timeout, kwargs)
        if not isinstance(factory, type):  # a function makes the class: one instance now, as TRL probes one at start
            try:
                instance = factory()
            except ConfigError:
                raise
            except Exception as exc:
                raise ConfigError(f"environment: {args.environment!r} could not be made ({type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else 'no message'}); check environment_kwargs") from None
            for attribute, function in inspect.getmembers(type(instance), predicate=inspect.isfunction):
                if attribute not in ("reset", "get_reward") and not attribute.startswith("_"):
                    _schema("environment", f"{args.environment}.{attribute}", getattr(instance, attribute))


def code_executors(args) -> list[str]:
    """The run's rewards, tools and environment that execute model-written code (``sandbox.executes_code``), as
    ``key: name``: what needs the sandbox's isolation before start."""
    from halo_core.rl.rewards import resolve

    named = [("reward_funcs", name, resolve(name)) for name in args.reward_funcs]
    named += [("tools", name, _resolve("tools", TOOLS, name, "")) for name in args.tools]
    if args.environment:
        named.append(("environment", args.environment, _resolve("environment", ENVIRONMENTS, args.environment, "")))
    return [f"{key}: {name}" for key, name, value in named if getattr(value, "executes_code", False)]
