"""Reward functions the GRPO tests name by dotted path (``grpo_rewards.lengths``), importable by every rank."""

from __future__ import annotations

import json
import os


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
