"""Reward functions the GRPO tests name by dotted path (``grpo_rewards.lengths``), importable by every rank."""

from __future__ import annotations

import json
import os

from halo_core.rl.rewards import code_tests
from halo_core.rl.environments.tools import python
from halo_core.rl.sandbox import executes_code, isolation


def token_sum(prompts, completions, completion_ids, **kwargs):
    """Differs within a group (the completion's token ids summed, mod 3; a random-init model rarely ends a
    completion early, so its length would not), and writes each call's completions to
    ``$HALO_TEST_RECORD.RANK`` (one JSON line per call) for the tests to compare."""
    path = os.environ.get("HALO_TEST_RECORD")
    if path:
        with open(f"{path}.{os.environ.get('RANK', '0')}", "a") as record:
            record.write(json.dumps({"prompts": prompts, "completions": [list(ids) for ids in completion_ids]}) + "\n")
    return [float(sum(ids) % 3) for ids in completion_ids]


def broken(prompts, completions, **kwargs):
    raise ZeroDivisionError("no reward today")


def short(prompts, completions, **kwargs):
    return [1.0]


def even_tokens(prompts, completions, completion_ids, **kwargs):
    """The share of a completion's tokens with an even id: a preference a random-init model can learn in steps."""
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


#: What ``code_by_parity`` runs: a right solution, and a hack that scored 1.0 before the sandbox (issue 47).
RIGHT = "def add(a, b):\n    return a + b"
HACK = "import os\nos._exit(0)"


@executes_code
def code_by_parity(prompts, completions, completion_ids, tests, **kwargs):
    """``code_tests`` on ``RIGHT`` where the completion's first token id is even and on ``HACK`` where it is odd (a
    random-init policy writes no code), so a launch's rewards say whether the sandbox graded each one; each call's
    first ids, rewards, the mechanism isolating this rank's runs, and what the ``python`` tool saw when it read the
    record's own file go to ``$HALO_TEST_RECORD.RANK``."""
    solutions = [RIGHT if ids[0] % 2 == 0 else HACK for ids in completion_ids]
    rewards = code_tests(prompts, solutions, tests, timeout_s=10.0)
    path = os.environ.get("HALO_TEST_RECORD")
    if path:
        mine = f"{path}.{os.environ.get('RANK', '0')}"
        with open(mine, "a") as record:
            record.write("")
        escape = python(f"print(open({mine!r}).read())")  # the trainer's own file, from inside the sandbox
        with open(mine, "a") as record:
            record.write(json.dumps({"first": [ids[0] for ids in completion_ids], "rewards": rewards, "isolation": isolation(),
                                     "escape": escape}) + "\n")
    return rewards
