"""Reward functions, by name from the ``halo.rewards`` entry-point group (``reward_funcs: [exact_answer, ...]``).

Each is a TRL reward function, ``f(prompts, completions, **columns) -> list[float | None]``, so TRL's
``GRPOTrainer`` takes it as it is; completions are strings or, for conversational data, lists of messages.
``checked`` wraps one so that raising or returning the wrong number of rewards is an error naming it.

Built-ins:
- ``exact_answer``: 1.0 when the completion's last number equals the row's ``answer`` column, else 0.0, as TRL's
  accuracy rewards compare a completion with the row's reference: a number, or a reference's final number (GSM8K's
  worked answers end ``#### 72``; thousands separators dropped on both sides).
- ``close_answer``: partial credit for a near miss, ``max(0, 1 - |last number - answer| / 50)`` (a dense signal
  for a policy that rarely hits the exact answer yet).
- ``equation_format``: 1.0 when the completion restates the prompt's sum (``What is a + b?``) as ``a + b = n``
  and nothing else, else 0.0.
- ``number_format``: 1.0 when the completion is one number and nothing else (an answer the parser reads
  without guessing), else 0.0.
- ``brevity``: ``min(1, 2 / tokens)`` of the completion (its end token counted): 1.0 for one token and the end, an
  answer's shape a random-init policy finds within a minute once a few of its completions stop early.
- ``code_tests``: the completion's code (the last fenced block, or all of it) run with the row's ``tests``
  (assert statements) in the isolated sandbox, each test graded from outside it (``halo_core.rl.sandbox``); 1.0
  when every test ran to its end and passed. The batch's completions are graded in parallel, on this machine or as
  Ray tasks (``halo_core.rl.execution``); one whose execution crashed scores 0.
"""

from __future__ import annotations

import math
import re
from importlib.metadata import entry_points
from typing import Callable

from halo_core.errors import ConfigError, HaloError
from halo_core.rl import execution
from halo_core.rl.sandbox import executes_code, run_tests

ENTRY_POINT_GROUP = "halo.rewards"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)


class RewardError(HaloError):
    """A reward function that raised or returned something other than one reward per completion."""


def text(completion) -> str:
    """A completion's text: a string as it is, a conversation's assistant messages joined."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion if m.get("role", "assistant") == "assistant")


#: A number as people write it in answers: thousands separators allowed (``1,234``), dropped before comparing.
_WRITTEN_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_number(value) -> float | None:
    """The number an answer ends on: a number as it is; in text, the last one after GSM8K's ``####`` marker if it has
    one, else the last one; ``None`` where there is none."""
    if isinstance(value, (int, float)):
        return float(value)
    value = str(value)
    numbers = [n.replace(",", "") for n in _WRITTEN_NUMBER.findall(value.rpartition("####")[2])]
    numbers = [n for n in numbers if n.strip("-")]
    return float(numbers[-1]) if numbers else None


def exact_answer(prompts, completions, answer, **kwargs) -> list[float]:
    rewards = []
    for completion, expected in zip(completions, answer):
        got, want = final_number(text(completion)), final_number(expected)
        rewards.append(1.0 if got is not None and want is not None and math.isclose(got, want, rel_tol=0, abs_tol=1e-9) else 0.0)
    return rewards


def close_answer(prompts, completions, answer, scale: float = 50.0, **kwargs) -> list[float]:
    rewards = []
    for completion, expected in zip(completions, answer):
        numbers = _NUMBER.findall(text(completion))
        off = abs(float(numbers[-1]) - float(expected)) if numbers else scale
        rewards.append(max(0.0, 1.0 - off / scale))
    return rewards


_QUESTION = re.compile(r"What is (.+?)\?")


def equation_format(prompts, completions, **kwargs) -> list[float]:
    rewards = []
    for prompt, completion in zip(prompts, completions):
        asked = _QUESTION.search(text(prompt) if isinstance(prompt, str) else "".join(m.get("content") or "" for m in prompt))
        stated = text(completion).strip()
        rewards.append(1.0 if asked and re.fullmatch(re.escape(asked[1]) + r" = -?\d+", stated) else 0.0)
    return rewards


def number_format(prompts, completions, **kwargs) -> list[float]:
    return [1.0 if _NUMBER.fullmatch(text(c).strip()) else 0.0 for c in completions]


def brevity(prompts, completions, completion_ids, **kwargs) -> list[float]:
    return [min(1.0, 2.0 / max(len(ids), 1)) for ids in completion_ids]


@executes_code
def code_tests(prompts, completions, tests, timeout_s: float = 5.0, memory_mb: int = 512, **kwargs) -> list[float]:
    jobs = [(code_block(text(c)), [str(x) for x in t], timeout_s, memory_mb) for c, t in zip(completions, tests)]
    reports = execution.run_all(run_tests, jobs)  # in parallel (execution_backend); None: the execution crashed
    return [1.0 if r is not None and r.total and r.passed == r.total else 0.0 for r in reports]


def code_block(completion: str) -> str:
    """The completion's last fenced Python block, or all of it."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def checked(name: str, function: Callable) -> Callable:
    """``function`` with its failures turned into one ``RewardError`` line naming it (TRL keeps ``__name__``)."""

    def reward(prompts, completions, **kwargs):
        try:
            values = function(prompts, completions, **kwargs)
        except Exception as exc:
            raise RewardError(f"reward function {name!r} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(values, (list, tuple)) or len(values) != len(completions):
            got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
            raise RewardError(f"reward function {name!r} returned {got} rewards for {len(completions)} completions; it must return one per completion")
        return list(values)

    reward.__name__ = name
    return reward


def known_rewards() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def resolve(name: str) -> Callable | None:
    """A reward by name, as TRL's ``grpo`` script finds one, with the ``halo.rewards`` group first: an entry point
    of that group, a function of ``trl.rewards``, or a dotted import path (``my_lib.rewards.custom``)."""
    import importlib

    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name in found:
        return found[name].load()
    import trl.rewards

    if callable(getattr(trl.rewards, name, None)):
        return getattr(trl.rewards, name)
    module, _, attribute = name.rpartition(".")
    if module:
        try:
            return getattr(importlib.import_module(module), attribute, None)
        except ImportError:
            return None
    return None


def configured(name: str, function: Callable, options: dict) -> Callable:
    """``function`` with ``options`` (``reward_kwargs``) bound: only arguments it names (a misspelt one would vanish
    into its ``**kwargs``), then its own ``check_options(**options)`` if it has one; refused before start."""
    import functools
    import inspect

    if not isinstance(options, dict):
        raise ConfigError(f"reward_kwargs: {name}: {options!r} must be a mapping of argument names to values")
    named = {p.name for p in inspect.signature(function).parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    named -= {"prompts", "completions"}  # TRL's to pass
    unknown = sorted(set(options) - named)
    if unknown:
        raise ConfigError(f"reward_kwargs: {name}: {unknown} are not arguments of reward {name!r} it may be given; it takes {sorted(named)}")
    check = getattr(function, "check_options", None)
    if check is not None:
        try:
            check(**options)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"reward_kwargs: {name}: {exc}") from None
    return functools.partial(function, **options)


def load_rewards(names: list[str], options: dict | None = None) -> list[Callable]:
    """The named rewards, each with its ``reward_kwargs`` entry bound; an entry for a reward not named is refused."""
    options = options or {}
    if not isinstance(options, dict):
        raise ConfigError(f"reward_kwargs: {options!r} must map reward names to their arguments, e.g. {{llm_judge: {{model: DIR}}}}")
    stray = sorted(set(options) - set(names))
    if stray:
        raise ConfigError(f"reward_kwargs: {stray} are not in reward_funcs {list(names)}; add them there or drop their entries")
    functions = []
    for name in names:
        function = resolve(name)
        if not callable(function):
            raise ConfigError(f"reward_funcs: {name!r} is unknown; installed rewards: {known_rewards()}, TRL's trl.rewards names, "
                              f"or a dotted import path (a package declares one in the {ENTRY_POINT_GROUP!r} entry-point group)")
        if name in options or hasattr(function, "check_options"):
            function = configured(name, function, options.get(name, {}))
        functions.append(checked(name, function))
    return functions
