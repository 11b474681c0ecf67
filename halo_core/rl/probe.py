"""The start-up check that a server's log-probs are the temperature-processed ones the IS correction divides by.

A server that reports raw log-probs at temperature != 1 (vLLM's default ``--logprobs-mode raw_logprobs``;
SGLang with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``) makes every importance-sampling ratio wrong (TRL issue 4159:
ratios near 2 at temperature 0.6). After the start-up sync the server holds the trainer's weights, so its
log-probs of a few sampled tokens must match the trainer's own ``log_softmax(logits / T)`` far better than
``log_softmax(logits)``; otherwise the run is refused, with the reason.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
from trl import GRPOTrainer

from halo_core.parallel.fsdp import reshard_all
from halo_core.rl.engines import SamplingParams
from halo_core.rl.server_engine import EngineError

#: Completion tokens the probe samples.
PROBE_TOKENS = 8


def _trainer_logprobs(trainer, prompt: list[int], completion: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The completion's log-probs as the trainer's IS ratio divides by them (TRL's fused head, its temperature built
    in), and raw (the plain forward's logits)."""
    device = next(trainer.model.parameters()).device
    ids = torch.tensor([prompt + completion], device=device)
    mask = torch.ones_like(ids)
    try:
        with torch.no_grad():  # TRL's own pass, below Halo's routing replay
            processed = GRPOTrainer._get_per_token_logps_and_entropies(trainer, trainer.model, ids, mask, len(completion))[0]
            logits = trainer.model(input_ids=ids, attention_mask=mask).logits
            logits = logits.full_tensor() if isinstance(logits, DTensor) else logits
    finally:
        reshard_all(trainer.model)
    raw = torch.log_softmax(logits[0, len(prompt) - 1 : -1].float(), -1).gather(-1, torch.tensor(completion, device=device)[:, None])[:, 0]
    return processed[0].float().cpu(), raw.cpu()


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
    processed, raw = _trainer_logprobs(trainer, prompt_ids[0], completion)
    off_processed = (served - processed).abs().mean().item()
    off_raw = (served - raw).abs().mean().item()
    if off_raw < off_processed:
        raise EngineError(
            f"rollout_engine {trainer.args.rollout_engine!r}: the server's log-probs at temperature {temperature} are the raw ones "
            f"(mean |difference| {off_raw:.3g} from the trainer's raw log-probs, {off_processed:.3g} from its temperature-processed "
            f"ones), so every importance-sampling ratio would be wrong (TRL issue 4159); start vLLM with --logprobs-mode "
            f"processed_logprobs (SGLang: unset SGLANG_RETURN_ORIGINAL_LOGPROB)")
