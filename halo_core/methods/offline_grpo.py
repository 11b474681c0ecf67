"""Offline GRPO: the GRPO policy loss over completions that were sampled and scored beforehand; method ``offline-grpo``.

Rows are groups, ``{"prompt": ..., "completions": [...], "rewards": [...]}`` (text or conversational, TRL's
formats). Tokenisation turns each group into one row per completion and computes its advantage once, with
the group normaliser ``advantage_normalizer`` (``halo_core.rl.advantages``); nothing is generated while
training. The loss is TRL's GRPO term with ``loss_type`` ``grpo``, ``bnpo`` or ``dr_grpo`` (``halo_core.rl.losses``):
one update per batch, so the ratio is 1 and its gradient the policy gradient ``-A ∇log π``.

Every reduction divides by the whole data-parallel batch's counts (completions, completion tokens), so a
rank's loss is its share and the layout equals one process for every loss type. Log-probs come from TRL's
fused LM head (no ``[tokens, vocab]`` log-softmax kept), which the mixin pools over a TP group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import Trainer, TrainingArguments
from trl.data_utils import maybe_apply_chat_template
from trl.trainer.utils import add_fused_lm_head

from halo_core.errors import ConfigError
from halo_core.rl.advantages import NORMALIZERS, group_advantages
from halo_core.rl.losses import LOSS_TYPES, per_token_loss, reduce_loss
from halo_core.trainers.method import Method
from halo_core.trainers.mixin import DistributedTrainerMixin
from halo_core.trainers.run_config import RunConfig


@dataclass
class OfflineGRPOConfig(TrainingArguments):
    """``TrainingArguments`` plus GRPO's loss keys under ``GRPOConfig``'s names, and the advantage normaliser."""

    loss_type: str = field(default="grpo", metadata={"help": f"One of {list(LOSS_TYPES)} (GRPOConfig's meanings)."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clip of the ratio: 1 - epsilon."})
    epsilon_high: float | None = field(default=None, metadata={"help": "Upper clip: 1 + epsilon_high (default: epsilon)."})
    advantage_normalizer: str = field(default="z_norm", metadata={"help": f"Group advantages from rewards: one of {list(NORMALIZERS)}."})
    max_completion_length: int | None = field(default=None, metadata={
        "help": "Completion tokens kept (the rest cut); dr_grpo's fixed divisor, which it requires."})
    max_prompt_length: int | None = field(default=None, metadata={"help": "Prompt tokens kept, from the left (the end stays); empty: all."})
    trust_remote_code: bool = field(default=False, metadata={
        "help": "Run a model folder's own modeling code (config.json auto_map, a model type transformers does not know), as TRL's configs take it."})
    remove_unused_columns: bool = False  # the collator reads the tokenised columns itself

    def __post_init__(self):
        super().__post_init__()
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {list(LOSS_TYPES)}, got {self.loss_type!r}")
        if self.advantage_normalizer not in NORMALIZERS:
            raise ValueError(f"advantage_normalizer must be one of {list(NORMALIZERS)}, got {self.advantage_normalizer!r}")
        if self.loss_type == "dr_grpo" and not self.max_completion_length:
            raise ValueError("loss_type 'dr_grpo' divides by max_completion_length: set it")


def flatten_groups(dataset, tokenizer, args: OfflineGRPOConfig):
    """One row per completion: ``prompt_ids``, ``completion_ids`` and its group ``advantage``."""

    def tokenize(batch):
        out = {"prompt_ids": [], "completion_ids": [], "advantage": []}
        for prompt, completions, rewards in zip(batch["prompt"], batch["completions"], batch["rewards"]):
            advantages = group_advantages(torch.tensor(rewards, dtype=torch.float32), args.advantage_normalizer).tolist()
            for completion, advantage in zip(completions, advantages):
                text = maybe_apply_chat_template({"prompt": prompt, "completion": completion}, tokenizer)
                prompt_ids = tokenizer(text["prompt"], add_special_tokens=False)["input_ids"]
                completion_ids = tokenizer(text["completion"], add_special_tokens=False)["input_ids"]
                if isinstance(completion, str) and tokenizer.eos_token_id is not None:
                    completion_ids = completion_ids + [tokenizer.eos_token_id]  # TRL ends a text completion with EOS
                if args.max_prompt_length:
                    prompt_ids = prompt_ids[-args.max_prompt_length:]
                if args.max_completion_length:
                    completion_ids = completion_ids[: args.max_completion_length]
                out["prompt_ids"].append(prompt_ids)
                out["completion_ids"].append(completion_ids)
                out["advantage"].append(advantage)
        return out

    return dataset.map(tokenize, batched=True, remove_columns=dataset.column_names)


class GroupCollator:
    """Prompt and completion joined, right-padded; ``completion_mask`` marks the completion tokens."""

    def __init__(self, pad_token_id: int):
        self.pad = pad_token_id

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        width = max(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows)
        ids = torch.full((len(rows), width), self.pad, dtype=torch.long)
        attention, completion = torch.zeros_like(ids), torch.zeros_like(ids)
        for i, r in enumerate(rows):
            p, c = len(r["prompt_ids"]), len(r["completion_ids"])
            ids[i, : p + c] = torch.tensor(r["prompt_ids"] + r["completion_ids"])
            attention[i, : p + c] = 1
            completion[i, p : p + c] = 1
        return {"input_ids": ids, "attention_mask": attention, "completion_mask": completion,
                "advantages": torch.tensor([r["advantage"] for r in rows], dtype=torch.float32)}


class OfflineGRPOTrainer(Trainer):
    """transformers' Trainer with the offline GRPO loss; runs as it is on one process (Halo's trainer adds the layout)."""

    def __init__(self, *args, **kwargs):
        tokenizer, config = kwargs["processing_class"], kwargs["args"]
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        for key in ("train_dataset", "eval_dataset"):
            if kwargs.get(key) is not None:
                kwargs[key] = flatten_groups(kwargs[key], tokenizer, config)
        kwargs.setdefault("data_collator", GroupCollator(tokenizer.pad_token_id))
        super().__init__(*args, **kwargs)
        add_fused_lm_head(self.model)
        # The loss is normalised by the batch's own counts and takes no num_items_in_batch (as classify's).
        self.model_accepts_loss_kwargs = False

    def batch_sum(self, counts: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The whole batch's ``counts`` and the number of shares it is split into (one process: this batch, 1)."""
        return counts, 1

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mask = inputs["completion_mask"][:, 1:]
        labels = inputs["input_ids"].masked_fill(inputs["completion_mask"] == 0, -100)
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels, use_cache=False,
                        fused_lm_head=True)
        logps = outputs.log_probs  # [B, T - 1]: position t scores token t + 1
        args = self.args
        losses = per_token_loss(logps, inputs["advantages"], epsilon_low=args.epsilon,
                                epsilon_high=args.epsilon if args.epsilon_high is None else args.epsilon_high)
        totals, shares = self.batch_sum(torch.stack([mask.new_tensor(mask.shape[0]), mask.sum()]).to(logps.dtype))
        loss = reduce_loss(losses, mask, args.loss_type, sequences=totals[0], tokens=totals[1],
                           max_completion_length=args.max_completion_length) * shares
        if model.training:
            self._log_batch(inputs, mask, logps.detach())
        return (loss, outputs) if return_outputs else loss

    def _log_batch(self, inputs, mask, logps) -> None:
        """Sums for the logged means, over the steps since the last log: mean token log-prob of the completions better
        than their group (advantage > 0) and worse (< 0), whose margin the loss widens."""
        mask = mask.to(logps.dtype)
        sums, tokens = (logps * mask).sum(-1), mask.sum(-1)
        better, worse = (inputs["advantages"] > 0).to(logps.dtype), (inputs["advantages"] < 0).to(logps.dtype)
        stats, _ = self.batch_sum(torch.stack([(sums * better).sum(), (tokens * better).sum(), (sums * worse).sum(), (tokens * worse).sum(),
                                               inputs["advantages"].abs().sum().to(logps.dtype), logps.new_tensor(mask.shape[0])]))
        self._halo_sums = stats if getattr(self, "_halo_sums", None) is None else self._halo_sums + stats

    def log(self, logs, *args, **kwargs):
        sums = getattr(self, "_halo_sums", None)
        if "loss" in logs and sums is not None:
            up, down = (sums[0] / sums[1].clamp(min=1)).item(), (sums[2] / sums[3].clamp(min=1)).item()
            logs.update({"logps/better": up, "logps/worse": down, "logps/margin": up - down,
                         "advantages/abs_mean": (sums[4] / sums[5].clamp(min=1)).item()})
            self._halo_sums = None
        return super().log(logs, *args, **kwargs)


class HaloOfflineGRPOTrainer(DistributedTrainerMixin, OfflineGRPOTrainer):
    """Offline GRPO on a Halo layout: a CP x TP group's rows pooled (``halo_sequence_loss``), counts summed over dp."""

    halo_sequence_loss = True

    def batch_sum(self, counts):
        return self.halo_batch_sum(counts)


def run(run: RunConfig) -> None:
    from halo_core.trainers.runtime import train

    train(run, HaloOfflineGRPOTrainer, OfflineGRPOConfig)


def check(run: RunConfig, args, world: int = 1) -> None:
    from halo_core.trainers.parts.data import first_rows

    for source in run.halo.dataset:
        for index, row in enumerate(first_rows(source) or ()):
            completions, rewards = row.get("completions"), row.get("rewards")
            if not isinstance(completions, list) or not isinstance(rewards, list) or len(completions) != len(rewards):
                raise ConfigError(
                    f"{run.source}: dataset {source.path!r} row {index + 1} has {_count(completions)} completions and {_count(rewards)} "
                    f"rewards; each group needs a list of completions and one reward per completion")
            if len(completions) < 2:
                raise ConfigError(f"{run.source}: dataset {source.path!r} row {index + 1} has {len(completions)} completion; a group "
                                  f"needs at least 2 (its advantages compare them)")


def _count(value) -> str:
    return str(len(value)) if isinstance(value, list) else f"no list of ({type(value).__name__})"


# No cp: GRPO's methods are declared without context parallelism (as the online method, whose generation needs it whole).
METHOD = Method(name="offline-grpo", config_class=OfflineGRPOConfig, run=run, trainer=HaloOfflineGRPOTrainer,
                splits=frozenset({"ep", "tp", "etp"}), columns=("prompt", "completions", "rewards"), check=check)
