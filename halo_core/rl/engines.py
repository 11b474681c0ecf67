"""The rollout-engine interface of the GRPO family: what generates completions, by name from ``halo.rollout_engines``.

An engine takes prompts (token ids) and returns, per completion, its token ids, the per-token log-probs it
sampled them with (after temperature and any top-p/top-k processing: the importance-sampling correction
compares them with the trainer's), and for MoE models the experts each completion token was routed to in every
layer (routing replay); ``update_weights`` takes the trained weights under their Hugging Face names. The
built-in ``hf`` engine generates in process with the training model; server engines (vLLM, SGLang) implement
the same interface over HTTP and a weight-update process group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Iterable, Protocol, runtime_checkable

import torch

from halo_core.errors import ConfigError

ENTRY_POINT_GROUP = "halo.rollout_engines"


@dataclass(frozen=True)
class SamplingParams:
    """What TRL's ``GRPOConfig`` sets for generation (``num_generations``, ``max_completion_length``, ...)."""

    num_generations: int
    max_completion_length: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    #: ``None``: draw from the process's generator (as TRL's ``generate`` does); an int: a generator of its own.
    seed: int | None = None


@dataclass
class Rollout:
    """``num_generations`` completions per prompt, prompt-major (prompt 0's completions first)."""

    #: Per completion: the prompt's token ids it continues.
    prompt_ids: list[list[int]]
    #: Per completion: its sampled token ids (ending in EOS unless cut at ``max_completion_length``).
    completion_ids: list[list[int]]
    #: Per completion: the sampler's log-prob of each of its tokens (temperature-processed).
    logprobs: list[list[float]]
    #: Per completion, for MoE models: ``[tokens, layers, top_k]`` expert indices its tokens were routed to; ``None``
    #: where the engine cannot report them (routing replay then records them in the trainer's old-policy pass).
    routed_experts: list[torch.Tensor] | None = None
    #: Engine-specific extras (finish reasons, timings), logged, never required.
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        counts = {len(self.prompt_ids), len(self.completion_ids), len(self.logprobs)}
        if len(counts) != 1:
            raise ValueError(f"a rollout needs one prompt, completion and log-prob list per completion; got lengths {sorted(counts)}")
        for index, (tokens, logprobs) in enumerate(zip(self.completion_ids, self.logprobs)):
            if len(tokens) != len(logprobs):
                raise ValueError(f"completion {index} has {len(tokens)} tokens but {len(logprobs)} log-probs")


@runtime_checkable
class RolloutEngine(Protocol):
    """What ``rollout_engine: NAME`` (an entry point of ``halo.rollout_engines``) provides."""

    def generate(self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None) -> Rollout:
        """``params.num_generations`` completions of each prompt; ``seeds``: one per completion, for an engine that
        seeds each (a server), else ignored."""

    def update_weights(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Take the trained weights (Hugging Face names, whole tensors: EP shards already gathered). Every trainer
        rank calls it and must consume ``named`` (gathering is collective); rank 0's tensors are the real ones."""

    def close(self) -> None:
        """Release what the engine holds (server connections, process groups)."""


def known_engines() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def engine_factory(name: str):
    """The factory registered as ``name`` (called with the trainer's model and config); a ``ConfigError`` naming the key."""
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name not in found:
        raise ConfigError(f"rollout_engine {name!r} is unknown; installed engines: {known_engines() or 'none'} "
                          f"(a package declares one in the {ENTRY_POINT_GROUP!r} entry-point group)")
    return found[name].load()
