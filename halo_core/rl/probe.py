"""The start-up check that a server's log-probs are the temperature-processed ones the IS correction divides by.

A server that reports raw log-probs at temperature != 1 (vLLM's default ``--logprobs-mode raw_logprobs``;
SGLang with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``) makes every importance-sampling ratio wrong (TRL issue 4159:
ratios near 2 at temperature 0.6). After the start-up sync the server holds the trainer's weights, so its
log-probs of a few sampled tokens must match the trainer's own ``log_softmax(logits / T)`` far better than
``log_softmax(logits)``; otherwise the run is refused, with the reason.
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer

from halo_core.parallel.fsdp import reshard_all
from halo_core.rl.engines import SamplingParams
from halo_core.rl.server_engine import EngineError

#: Completion tokens the probe samples.
PROBE_TOKENS = 8


def _trainer_logprobs(trainer, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    device = next(trainer.model.parameters()).device
    ids = torch.tensor([prompt + completion], device=device)
    saved, trainer.temperature = trainer.temperature, temperature
    try:
        with torch.no_grad():  # TRL's own pass (below Halo's routing replay): what the trainer's IS ratio divides by
            logps, _ = GRPOTrainer._get_per_token_logps_and_entropies(trainer, trainer.model, ids, torch.ones_like(ids), len(completion))
    finally:
        trainer.temperature = saved
        reshard_all(trainer.model)
    return logps[0].float().cpu()


def probe_logprobs(trainer) -> None:
    """Every rank runs it (the trainer's forward is collective); the server is asked the same seeded request by each."""
    temperature = float(trainer.temperature)
    if temperature == 1.0:
        return  # raw and processed agree
    row = trainer.train_dataset[0]
    prompt_ids, _, _ = trainer._tokenize_prompts([row["prompt"]])
    engine = trainer._halo_rollouts.engine
    params = SamplingParams(num_generations=1, max_completion_length=min(PROBE_TOKENS, trainer.max_completion_length), temperature=temperature)
    rollout = engine.generate(prompt_ids, params, seeds=[trainer.args.seed])
    completion, served = rollout.completion_ids[0], torch.tensor(rollout.logprobs[0])
    if not completion:
        return
    processed = _trainer_logprobs(trainer, prompt_ids[0], completion, temperature)
    raw = _trainer_logprobs(trainer, prompt_ids[0], completion, 1.0)
    off_processed = (served - processed).abs().mean().item()
    off_raw = (served - raw).abs().mean().item()
    if off_raw < off_processed:
        raise EngineError(
            f"rollout_engine {trainer.args.rollout_engine!r}: the server's log-probs at temperature {temperature} are the raw ones "
            f"(mean |difference| {off_raw:.3g} from the trainer's raw log-probs, {off_processed:.3g} from its temperature-processed "
            f"ones), so every importance-sampling ratio would be wrong (TRL issue 4159); start vLLM with --logprobs-mode "
            f"processed_logprobs (SGLang: unset SGLANG_RETURN_ORIGINAL_LOGPROB)")
