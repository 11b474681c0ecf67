"""The built-in ``hf`` rollout engine: ``generate`` on the training model itself, in process, on its layout.

Sampling is TRL's (the trainer's ``GenerationConfig``: temperature, top-p, top-k, min-p, repetition penalty;
one row per completion, left-padded) with two changes that make a run's completions independent of how
many data-parallel ranks share the batch:

- each step's draw is one ``torch.multinomial`` over the whole data-parallel batch's processed
  probabilities (gathered over the ``dp`` group), from the process's generator; every rank holds the same
  generator state (same seed), so every rank draws what one process drawing the whole batch draws, which
  is stock ``generate``'s own draw at one process, and keeps its rows;
- no rank stops before the last row of the batch is done: expert parallelism exchanges tokens at every
  step, and the draw above is a collective. Rows that finished keep stepping; their tokens after EOS are
  cut, as TRL cuts them.

The log-probs are those of the processed scores the tokens were drawn from, what an inference server
reports. Routed experts are not recorded during generation (the cache makes each step one token); the
trainer's old-policy pass records them (``RoutingReplay``). Weights need no update: the engine is the model.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from transformers import GenerationConfig, LogitsProcessor, StoppingCriteria

from halo_core.rl.engines import Rollout, SamplingParams


def _warpers(config: GenerationConfig) -> list:
    """The sampling warpers ``generate`` would add for ``config``, in its order. ``generate`` runs a caller's
    processors before its warpers, so the draw below applies them itself and runs ``generate`` greedily."""
    from transformers.generation import logits_process as lp

    if not config.do_sample:
        return []
    warpers = []
    if config.temperature is not None and config.temperature != 1.0:
        warpers.append(lp.TemperatureLogitsWarper(config.temperature))
    if getattr(config, "top_h", None) is not None:
        warpers.append(lp.TopHLogitsWarper(top_h=config.top_h))
    if config.top_k:
        warpers.append(lp.TopKLogitsWarper(top_k=config.top_k))
    if config.top_p is not None and config.top_p < 1.0:
        warpers.append(lp.TopPLogitsWarper(top_p=config.top_p))
    if config.min_p is not None:
        warpers.append(lp.MinPLogitsWarper(min_p=config.min_p))
    if config.typical_p is not None and config.typical_p < 1.0:
        warpers.append(lp.TypicalLogitsWarper(mass=config.typical_p))
    if config.epsilon_cutoff is not None and 0.0 < config.epsilon_cutoff < 1.0:
        warpers.append(lp.EpsilonLogitsWarper(epsilon=config.epsilon_cutoff))
    if config.eta_cutoff is not None and 0.0 < config.eta_cutoff < 1.0:
        warpers.append(lp.EtaLogitsWarper(epsilon=config.eta_cutoff))
    return warpers


class _BatchDraw(LogitsProcessor):
    """Applies the sampling warpers, draws each row's token as one process drawing the whole batch would, records
    its log-prob, and leaves ``generate`` (greedy) a score row whose only finite entry is that token."""

    def __init__(self, warpers: list, sample: bool, generator: torch.Generator | None, group, counts: list[int], eos: list[int],
                 min_new_tokens: int):
        self.warpers, self.sample, self.generator, self.group, self.counts = warpers, sample, generator, group, counts
        self.eos, self.min_new_tokens = eos, min_new_tokens  # generate's own EOS processors see no EOS (HFEngine.generate)
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        if len(self.logprobs) < self.min_new_tokens:
            scores = scores.index_fill(-1, torch.tensor(self.eos, device=scores.device), -float("inf"))
        for warper in self.warpers:
            scores = warper(input_ids, scores)
        logp = scores.float().log_softmax(-1)
        if not self.sample:
            tokens = logp.argmax(-1)
        elif len(self.counts) == 1:
            tokens = torch.multinomial(logp.exp(), 1, generator=self.generator).squeeze(1)
        else:
            rank, widest = dist.get_rank(self.group), max(self.counts)
            padded = logp.new_zeros(widest, logp.shape[1])
            padded[: logp.shape[0]] = logp.exp()
            padded[logp.shape[0]:, 0] = 1.0  # rows this rank does not have still draw (and are dropped)
            pieces = [torch.empty_like(padded) for _ in self.counts]
            dist.all_gather(pieces, padded, group=self.group)
            whole = torch.cat([p[:n] for p, n in zip(pieces, self.counts)])
            start = sum(self.counts[:rank])
            tokens = torch.multinomial(whole, 1, generator=self.generator).squeeze(1)[start : start + self.counts[rank]]
        self.logprobs.append(logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))
        return torch.full_like(scores, -float("inf")).scatter_(-1, tokens.unsqueeze(-1), 0.0)


class _BatchDone(StoppingCriteria):
    """Every row stops once every row of the data-parallel batch has produced an end-of-sequence token."""

    def __init__(self, eos: list[int], group, multi: bool):
        self.eos, self.group, self.multi, self.done = eos, group, multi, None

    def __call__(self, input_ids, scores, **kwargs):
        ended = torch.isin(input_ids[:, -1], torch.tensor(self.eos, device=input_ids.device))
        self.done = ended if self.done is None else self.done | ended
        finished = self.done.all().to(torch.int64).reshape(1)
        if self.multi:
            dist.all_reduce(finished, op=dist.ReduceOp.MIN, group=self.group)
        return torch.full_like(ended, bool(finished.item()))


class HFEngine:
    #: The engine is the training model: no weights to send after a step.
    shares_weights = True

    def __init__(self, model, tokenizer, generation_config: GenerationConfig, group=None):
        self.model, self.tokenizer, self.config, self.group = model, tokenizer, generation_config, group

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams, seeds=None) -> Rollout:
        config = copy.deepcopy(self.config)  # the trainer's (TRL's sampling keys and generation_kwargs)
        config.max_new_tokens = params.max_completion_length
        eos = config.eos_token_id if config.eos_token_id is not None else self.tokenizer.eos_token_id
        eos = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        # _BatchDone stops the batch; generate must not stop this rank on its own. An unset eos_token_id would be taken
        # from the model's generation config, so it is set to an id no vocabulary row has.
        config.eos_token_id = [self.model.config.get_text_config().vocab_size]
        pad = config.pad_token_id = config.pad_token_id if config.pad_token_id is not None else eos[0]
        rows = [p for p in prompts for _ in range(params.num_generations)]
        width = max(len(p) for p in rows)
        device = next(self.model.parameters()).device
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in rows], device=device)  # left-padded: generation continues right
        mask = (torch.arange(width, device=device) >= torch.tensor([width - len(p) for p in rows], device=device).unsqueeze(1)).long()
        multi = self.group is not None and dist.get_world_size(self.group) > 1
        counts = [len(rows)]
        if multi:
            gathered = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(gathered, len(rows), group=self.group)
            counts = gathered
        generator = None if params.seed is None else torch.Generator(device=device).manual_seed(params.seed)
        draw = _BatchDraw(_warpers(config), bool(config.do_sample), generator, self.group, counts, eos, config.min_new_tokens or 0)
        config.min_new_tokens = None
        # Greedy over the draw's one-hot scores; the warpers ran in the draw (GenerationConfig would warn of them).
        config.do_sample, config.temperature, config.top_p, config.top_k, config.min_p = False, None, None, None, None
        was_training = self.model.training
        self.model.eval()
        try:
            # Eager: decode steps through compiled layers (compile_layers) would fill their compile cache with a graph per
            # cache state and shape, leaving the training passes eager.
            with torch.compiler.set_stance("force_eager"):
                # No router logits: a trainer that adds the MoE aux loss turns them on in the config, and the aux loss of a
                # cached decoding step (one token against the whole attention mask) does not line up.
                extra = {"output_router_logits": False} if hasattr(self.model.config.get_text_config(), "output_router_logits") else {}
                out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config, logits_processor=[draw],
                                          stopping_criteria=[_BatchDone(eos, self.group, multi)], synced_gpus=False, **extra)
        finally:
            self.model.train(was_training)
        new = out[:, width:].tolist()
        taken = torch.stack(draw.logprobs, dim=1).tolist() if draw.logprobs else [[] for _ in rows]
        completions, logprobs = [], []
        for tokens, row_logprobs in zip(new, taken):
            end = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
            completions.append(tokens[:end])
            logprobs.append(row_logprobs[:end])
        return Rollout(rows, completions, logprobs)

    def update_weights(self, named) -> None:
        """Nothing to send: the engine generates with the model being trained."""

    def close(self) -> None:
        pass


def hf_engine(model, tokenizer, generation_config: GenerationConfig, group=None, **kwargs) -> HFEngine:
    return HFEngine(model, tokenizer, generation_config, group)
