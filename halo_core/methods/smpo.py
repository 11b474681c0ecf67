"""Smooth Margin Preference Optimization: reference-free, on ``trl.DPOTrainer``'s data path.

With per-sequence mean token log-probabilities of the chosen and rejected completions,
``z = mean_logp(chosen) - max(mean_logp(rejected), min_log_prob) - m(step)`` and the loss is
``l(beta * z) + r * CE(chosen) + (1 - r) * CE(rejected)``: the margin term pushes the chosen
completion above the rejected one by a margin that ramps from ``initial_margin`` to
``target_margin`` over the run, the floor stops pushing a rejected completion that is already
unlikely, and the cross-entropy anchors (``chosen_sft_ratio`` = r) keep both fluent. Chosen and
rejected run through the model in one forward (TRL's collator stacks them); under CP the fused
head's per-token log-probs are gathered over the group (``parts.pool``), so the per-sequence sums
and counts are whole before the means.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
import trl.trainer.dpo_trainer
from trl import DPOConfig, DPOTrainer

from halo_core.integrations.trl import hashing_shards, reference_given
from halo_core.trainers.method import Method
from halo_core.trainers.mixin import DistributedTrainerMixin
from halo_core.trainers.run_config import RunConfig

LOSSES = {
    "smooth_lower_bound": lambda u: torch.relu(-u).square(),
    "hinge": lambda u: torch.relu(1 - u),
    "sigmoid": lambda u: -F.logsigmoid(u),
    "ipo": lambda u: u.square(),
}


@dataclass
class SMPOConfig(DPOConfig):
    """``DPOConfig`` (its data, length and batching keys) with SMPO's own; no reference model is kept."""

    beta: float = field(default=1.2, metadata={"help": "Scale of the margin term's argument: l(beta * z)."})
    loss_type: list[str] = field(default_factory=lambda: ["smooth_lower_bound"],
                                 metadata={"help": f"The margin term's l: one of {sorted(LOSSES)}."})
    initial_margin: float = field(default=0.0, metadata={"help": "Margin m at step 0; it ramps linearly to target_margin over the run."})
    target_margin: float = field(default=0.35, metadata={"help": "Margin m at the last step (in mean token log-prob)."})
    chosen_sft_ratio: float = field(default=0.8, metadata={"help": "r: weight of CE(chosen); CE(rejected) gets 1 - r."})
    min_log_prob: float = field(default=-2.3, metadata={"help": "Floor on the rejected mean log-prob the margin term sees."})

    def __post_init__(self):
        super().__post_init__()
        if len(self.loss_type) != 1 or self.loss_type[0] not in LOSSES:
            raise ValueError(f"loss_type must be one of {sorted(LOSSES)}, got {self.loss_type}")
        if not 0 <= self.chosen_sft_ratio <= 1:
            raise ValueError(f"chosen_sft_ratio must be in [0, 1], got {self.chosen_sft_ratio}")


def margin_at(step: int, total: int, initial: float, target: float) -> float:
    """The margin's linear ramp: ``initial`` at step 0, ``target`` from the last step on."""
    return target if total <= 0 else initial + (target - initial) * min(step / total, 1.0)


def smpo_loss(chosen: torch.Tensor, rejected: torch.Tensor, *, beta: float, margin: float, sft_ratio: float, min_log_prob: float,
              loss_type: str = "smooth_lower_bound") -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's loss and per-pair ``z`` from per-sequence mean token log-probs ``chosen`` and ``rejected``."""
    z = chosen - rejected.clamp(min=min_log_prob) - margin
    loss = LOSSES[loss_type](beta * z).mean() + sft_ratio * -chosen.mean() + (1 - sft_ratio) * -rejected.mean()
    return loss, z


class HaloSMPOTrainer(DistributedTrainerMixin, DPOTrainer):
    """SMPO over ``DPOTrainer``'s tokenisation, collator and fused head; its loss replaces DPO's."""

    halo_sequence_loss = True
    halo_row_groups = 2

    def __init__(self, *args, **kwargs):
        # SMPO keeps no reference policy; DPOTrainer would load one from the hub id when given none.
        with hashing_shards(trl.trainer.dpo_trainer), reference_given(trl.trainer.dpo_trainer, None):
            super().__init__(*args, **kwargs)

    def _compute_loss(self, model, inputs, return_outputs):
        mode = "train" if self.model.training else "eval"
        mask = inputs["completion_mask"]
        labels = inputs["input_ids"].masked_fill(mask == 0, -100)
        kwargs = {"output_router_logits": True} if self.aux_loss_enabled else {}
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels, use_cache=False,
                        fused_lm_head=True, **kwargs)
        counts = mask[:, 1:].sum(dim=1)
        means = outputs.log_probs.sum(dim=1) / counts.clamp(min=1)
        chosen, rejected = means.chunk(2)
        args = self.args
        margin = margin_at(self.state.global_step, self.state.max_steps, args.initial_margin, args.target_margin)
        loss, z = smpo_loss(chosen, rejected, beta=args.beta, margin=margin, sft_ratio=args.chosen_sft_ratio,
                            min_log_prob=args.min_log_prob, loss_type=args.loss_type[0])
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * outputs.aux_loss
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(outputs.aux_loss.detach()).mean().item())
        if mode == "train":
            self._total_train_tokens += self.accelerator.gather_for_metrics(inputs["attention_mask"].sum()).sum().item()
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        gathered = {name: self.accelerator.gather(value.detach()) for name, value in (("c", chosen), ("r", rejected), ("z", z))}
        self._metrics[mode]["margin"].append(margin)
        self._metrics[mode]["z"].append(gathered["z"].mean().item())
        self._metrics[mode]["logps/chosen"].append(gathered["c"].mean().item())
        self._metrics[mode]["logps/rejected"].append(gathered["r"].mean().item())
        self._metrics[mode]["rewards/margins"].append((gathered["c"] - gathered["r"]).mean().item())
        self._metrics[mode]["rewards/accuracies"].append((gathered["c"] > gathered["r"]).float().mean().item())
        return (loss, outputs) if return_outputs else loss


def run(run: RunConfig) -> None:
    from halo_core.trainers.runtime import train

    train(run, HaloSMPOTrainer, SMPOConfig)


METHOD = Method(name="smpo", config_class=SMPOConfig, run=run, trainer=HaloSMPOTrainer, splits=frozenset({"ep", "cp", "tp", "etp"}), columns=("chosen", "rejected"))
