"""The built-in ``hf`` rollout engine: ``generate`` on the training model itself, in process, on its layout.

Every rank generates its own prompts; with more than one rank ``synced_gpus`` keeps the ranks stepping together
until the last is done (EP exchanges tokens at every step, so a rank that stopped early would leave its peers
waiting). The log-probs are those of the processed scores ``generate`` sampled from (temperature, top-p, top-k
applied), what an inference server reports. Routed experts are not recorded during generation (the cache makes
each step one token); the trainer's old-policy pass records them (``RoutingReplay``). Weights need no update:
the engine is the model.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from halo_core.rl.engines import Rollout, SamplingParams


class HFEngine:
    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # left-padded: generation continues on the right
        mask = (torch.arange(width) >= torch.tensor([width - len(p) for p in prompts]).unsqueeze(1)).long()
        device = next(self.model.parameters()).device
        torch.manual_seed(params.seed)
        sample = params.temperature > 0
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=params.max_completion_length,
                do_sample=sample, temperature=params.temperature if sample else None, top_p=params.top_p if sample else None,
                top_k=params.top_k if sample else None, num_return_sequences=params.num_generations, pad_token_id=pad,
                return_dict_in_generate=True, output_scores=True, synced_gpus=dist.is_initialized() and dist.get_world_size() > 1,
            )
        finally:
            self.model.train(was_training)
        new = out.sequences[:, width:]
        scores = torch.stack(out.scores, dim=1).float().log_softmax(-1)  # [N, steps, vocab], processed as sampled
        taken = scores.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        eos = self.tokenizer.eos_token_id
        prompt_ids, completions, logprobs = [], [], []
        for row in range(new.shape[0]):
            tokens = new[row].tolist()
            end = next((i + 1 for i, t in enumerate(tokens) if t == eos), len(tokens))
            prompt_ids.append(prompts[row // params.num_generations])
            completions.append(tokens[:end])
            logprobs.append(taken[row, :end].tolist())
        return Rollout(prompt_ids, completions, logprobs)

    def update_weights(self, named) -> None:
        """Nothing to send: the engine generates with the model being trained."""

    def close(self) -> None:
        pass


def hf_engine(model, tokenizer, **kwargs) -> HFEngine:
    return HFEngine(model, tokenizer)
