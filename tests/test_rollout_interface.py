"""The rollout-engine interface's own checks: a rollout whose lists disagree is refused, an unknown engine named."""

from __future__ import annotations

import pytest

from halo_core.errors import ConfigError
from halo_core.rl.engines import Rollout, engine_factory


def test_a_rollout_with_mismatched_lists_is_refused():
    Rollout(prompt_ids=[[1, 2]], completion_ids=[[3, 4]], logprobs=[[-0.1, -0.2]])
    with pytest.raises(ValueError, match="completion 0 has 2 tokens but 1 log-probs"):
        Rollout(prompt_ids=[[1, 2]], completion_ids=[[3, 4]], logprobs=[[-0.1]])
    with pytest.raises(ValueError, match="one prompt, completion and log-prob list per completion"):
        Rollout(prompt_ids=[[1], [1]], completion_ids=[[3]], logprobs=[[-0.1]])


def test_an_unknown_engine_is_refused_with_the_key():
    with pytest.raises(ConfigError, match="rollout_engine 'nope' is unknown"):
        engine_factory("nope")
