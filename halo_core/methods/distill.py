"""Knowledge distillation: ``HaloDistillTrainer(DistributedTrainerMixin, trl.experimental.gkd.GKDTrainer)``, method ``distill``.

Built on TRL's ``GKDTrainer`` rather than its ``DistillationTrainer``: in TRL 1.16 the latter trains only on
the student's own generations from prompts, while GKD takes fixed data (``messages``), mixes in on-policy
student generations with probability ``lmbda`` and teacher generations with ``seq_kd``, which is what
distillation on fixed data needs. Its keys (``beta``, ``lmbda``, ``temperature`` (sampling), ``max_new_tokens``,
``seq_kd``, ``teacher_model_name_or_path``) mean what they mean in TRL.

What Halo changes at the seams, each so that every layout equals one process:

- **Teacher**: laid out under its own family's plugin with its own degrees (``teacher_*_parallel_size``; by default
  the student's, and no expert split for a dense teacher), frozen, in eval mode, no optimizer state. Without
  ``teacher_model_name_or_path`` the teacher is the student's own starting weights (self-distillation), one
  frozen copy built as the policy's reference is.
- **Rows** are right-padded for the loss (GKD's collator left-pads, which shifts each row's positions by its
  batch's padding; CP and TP split right-padded rows), the prompts stay left-padded for generation.
- **On-policy rows** (``lmbda``, ``seq_kd``) come from the ``hf`` rollout engine, which draws the whole data-parallel
  batch as one process would; the coin that picks them is drawn from (seed, step, micro-batch), the same on every
  rank and on a resumed run, where GKD draws Python's process-wide ``random``.
- **Loss**: GKD's divergence (``halo_core.methods.divergence``) at ``loss_temperature`` (1, as GKD computes it, by
  default), summed over completion tokens and divided by the whole batch's count (``num_items_in_batch``, as GKD),
  times the world size as transformers' ``compute_loss`` does for such a count (GKD's omits it).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # GKD is chosen knowingly (above); its import would warn on every rank
from trl.experimental.gkd import GKDConfig, GKDTrainer  # noqa: E402
from trl.experimental.utils import DataCollatorForChatML  # noqa: E402

from halo_core.errors import ConfigError
from halo_core.methods.divergence import generalized_jsd
from halo_core.parallel.config import RUN_KEYS
from halo_core.parallel.layout_state import layout_of
from halo_core.rl.engines import SamplingParams
from halo_core.rl.hf_engine import HFEngine
from halo_core.trainers.method import Method
from halo_core.trainers.mixin import DistributedTrainerMixin
from halo_core.trainers.run_config import RunConfig


#: The teacher's own degrees: each split's run key with ``teacher_`` before it (``HaloDistillConfig`` declares them).
TEACHER_KEYS = {s: f"teacher_{RUN_KEYS[s]}" for s in ("ep", "etp", "tp")}


@dataclass
class HaloDistillConfig(GKDConfig):
    """``GKDConfig`` plus the teacher's layout and the divergence's temperature."""

    loss_temperature: float = field(default=1.0, metadata={
        "help": "Softens both distributions in the divergence (logits / T). GKD's own temperature is the sampling temperature."})
    teacher_expert_parallel_size: int | None = field(default=None, metadata={
        "help": "The teacher's EP degree; empty: the student's for an MoE teacher, 1 for a dense one."})
    teacher_expert_tensor_parallel_size: int | None = field(default=None, metadata={
        "help": "The teacher's ETP degree; empty: the student's for an MoE teacher, 1 for a dense one."})
    teacher_tensor_parallel_size: int | None = field(default=None, metadata={"help": "The teacher's TP degree; empty: the student's."})


class LayoutGKDTrainer(GKDTrainer):
    """``GKDTrainer`` with its on-policy step and loss in the form a Halo layout feeds: it sits below the mixin in the
    MRO, so the mixin's CP/TP split reaches this loss, where GKD's own would read left-padded, unsplit rows."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        coin = random.Random(f"{self.args.seed}:{self.state.global_step}:{self._halo_micro()}").random()
        if coin <= self.lmbda:
            inputs = self._halo_generated(self._halo_student_engine, inputs)
        elif self.seq_kd:
            inputs = self._halo_generated(self._halo_teacher_engine, inputs)
        return super(GKDTrainer, self).training_step(model, inputs, num_items_in_batch)

    def _halo_micro(self) -> int:
        step, count = getattr(self, "_halo_micro_at", (None, 0))
        count = count + 1 if step == self.state.global_step else 0
        self._halo_micro_at = (self.state.global_step, count)
        return count

    def _halo_generated(self, engine: HFEngine, inputs: dict) -> dict:
        """The batch's prompts continued by ``engine`` (GKD's ``generate_on_policy_outputs``): the rows become prompt +
        completion (up to and with its EOS), right-padded, labelled on the completion only."""
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(inputs["prompts"], inputs["prompt_attention_mask"])]
        params = SamplingParams(num_generations=1, max_completion_length=self.args.max_new_tokens, temperature=self.args.temperature)
        rollout = engine.generate(prompts, params)
        rows = [p + c for p, c in zip(prompts, rollout.completion_ids)]
        width = max(len(r) for r in rows)
        pad = self._halo_pad_token_id()
        device = inputs["input_ids"].device
        ids = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for i, (prompt, row) in enumerate(zip(prompts, rows)):
            ids[i, : len(row)] = torch.tensor(row, device=device)
            mask[i, : len(row)] = 1
            labels[i, len(prompt) : len(row)] = ids[i, len(prompt) : len(row)]
        return {**inputs, "input_ids": ids, "attention_mask": mask, "labels": labels}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        forward = {k: inputs[k] for k in ("input_ids", "attention_mask", "position_ids") if k in inputs}
        student = model(**forward, use_cache=False).logits
        self.teacher_model.eval()
        with torch.no_grad():
            teacher = self.teacher_model(**forward, use_cache=False).logits
        if "shift_labels" in inputs:  # a CP x TP split: labels already aligned with the positions that predict them
            labels = inputs["shift_labels"]
        else:
            student, teacher, labels = student[:, :-1], teacher[:, :-1], inputs["labels"][:, 1:]
        keep = labels != -100
        total = generalized_jsd(student[keep], teacher[keep], self.beta, self.args.loss_temperature).sum()
        if num_items_in_batch is None:
            loss = total / keep.sum().clamp_min(1)
        else:
            loss = total / torch.as_tensor(num_items_in_batch, device=total.device)
            if self.args.average_tokens_across_devices and (self.model_accepts_loss_kwargs or self.compute_loss_func):
                # transformers' own compute_loss does this for a count over every rank (GKD's omits it, so stock GKD's
                # gradient shrinks with the world size); the mixin then averages over data-parallel ranks.
                loss = loss * self.accelerator.num_processes
        return (loss, {"logits": student}) if return_outputs else loss


class HaloDistillTrainer(DistributedTrainerMixin, LayoutGKDTrainer):
    """TRL's GKDTrainer on a Halo layout, with a laid-out frozen teacher."""

    def __init__(self, *args, teacher_model=None, **kwargs):
        config = kwargs["args"]
        if kwargs.get("data_collator") is None and kwargs.get("processing_class") is not None:
            kwargs["data_collator"] = RightPadded(DataCollatorForChatML(tokenizer=kwargs["processing_class"], max_length=config.max_length))
        super().__init__(*args, teacher_model=teacher_model, **kwargs)
        group = layout_of(self.model).group("dp") if dist.is_initialized() else None
        self._halo_student_engine = HFEngine(self.model, self.processing_class, self.generation_config, group)
        self._halo_teacher_engine = HFEngine(self.teacher_model, self.processing_class, self.generation_config, group)


class RightPadded:
    """GKD's ChatML collator over rows in TRL's formats (``messages``, or a ``prompt`` and its ``completion``,
    conversational or text), its training rows moved to right padding; the prompts stay left-padded."""

    def __init__(self, collator: DataCollatorForChatML):
        self.collator = collator

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.collator([_as_chat(self.collator.tokenizer, e) for e in examples])
        mask = batch["attention_mask"]
        order = torch.argsort(1 - mask, dim=1, stable=True)  # real tokens first, in order; the left padding after them
        for key, fill in (("input_ids", self.collator.tokenizer.pad_token_id), ("labels", -100)):
            moved = batch[key].gather(1, order)
            batch[key] = moved.masked_fill(mask.gather(1, order) == 0, fill)
        batch["attention_mask"] = mask.gather(1, order)
        return batch


def _as_chat(tokenizer, example: dict) -> dict:
    if "messages" in example:
        return example
    prompt, completion = example["prompt"], example["completion"]
    if isinstance(prompt, list):
        return {"messages": prompt + completion}
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    return {"prompt": prompt, "input_ids": prompt_ids + completion_ids, "completion_mask": [0] * len(prompt_ids) + [1] * len(completion_ids)}


# -- the run ---------------------------------------------------------------------------------------

def teacher_parallel(run: RunConfig, args, teacher_config):
    """The teacher's degrees: the keys where set, else the student's (no expert split for a dense teacher); the
    same CP as the student's, whose sequence chunks it reads."""
    import dataclasses

    from halo_core.parallel.plan import EXPERT_COUNT_FIELDS, first_field

    student = run.halo.parallel_config()
    moe = teacher_config is None or bool(first_field(teacher_config, EXPERT_COUNT_FIELDS))
    default = {"ep": student.ep if moe else 1, "etp": student.etp if moe else 1, "tp": student.tp}
    asked = {s: getattr(args, key) for s, key in TEACHER_KEYS.items()}
    return dataclasses.replace(student, **{s: default[s] if asked[s] is None else asked[s] for s in TEACHER_KEYS})


def build_teacher(run: RunConfig, args, parallel):
    """The teacher model, frozen: from ``teacher_model_name_or_path`` laid out by its own degrees, else the student's
    starting weights laid out as the student is."""
    import dataclasses

    from transformers import AutoConfig

    from halo_core.trainers.runtime import build_reference

    if not args.teacher_model_name_or_path:
        return build_reference(run.halo, args, parallel), parallel
    halo = dataclasses.replace(run.halo, model_name_or_path=args.teacher_model_name_or_path, random_init=False)
    own = teacher_parallel(run, args, AutoConfig.from_pretrained(args.teacher_model_name_or_path))
    return build_reference(halo, args, own), own


def run(run: RunConfig) -> None:
    from halo_core.trainers.runtime import train

    train(run, HaloDistillTrainer, HaloDistillConfig, frozen=lambda args, parallel: {"teacher_model": build_teacher(run, args, parallel)})


def check(run: RunConfig, args, world: int = 1) -> None:
    """The teacher (readable, same vocabulary, a layout that fits) and the keys GKD's own check leaves to the first step."""
    where = run.source
    if args.loss_temperature <= 0:
        raise ConfigError(f"{where}: loss_temperature: {args.loss_temperature} must be above 0")
    if args.temperature <= 0 and (args.lmbda > 0 or args.seq_kd):
        raise ConfigError(f"{where}: temperature: {args.temperature} must be above 0 to sample on-policy rows (lmbda: {args.lmbda}); "
                          f"set it, or lmbda: 0 and seq_kd: false")
    dims = run.halo.parallel_config()
    if (args.lmbda > 0 or args.seq_kd) and (dims.cp > 1 or dims.tp > 1):
        raise ConfigError(f"{where}: lmbda: {args.lmbda} (or seq_kd) generates on-policy rows, which runs whole sequences on every "
                          f"rank: context_parallel_size and tensor_parallel_size must be 1 (experts may be split); or set lmbda: 0")
    if args.teacher_model_name_or_path:
        _check_teacher(run, args, world)


def _check_teacher(run: RunConfig, args, world: int) -> None:
    from pathlib import Path

    from transformers import AutoConfig

    from halo_core.errors import HaloError
    from halo_core.parallel.plan import plan_layout
    from halo_core.registry import discover
    from halo_core.trainers.run_config import model_config_of

    where, path = run.source, args.teacher_model_name_or_path
    if not Path(path).exists():
        return  # a hub id: read when the worker loads it
    try:
        teacher = AutoConfig.from_pretrained(path)
    except Exception as exc:
        raise ConfigError(f"{where}: teacher_model_name_or_path {path} has no readable config.json ({exc})") from None
    student = model_config_of(run)  # None for a hub id: its vocabulary is compared when the worker loads both
    sizes = (student.get_text_config().vocab_size if student else None, teacher.get_text_config().vocab_size)
    if student and sizes[0] != sizes[1]:
        raise ConfigError(f"{where}: teacher_model_name_or_path {path} has vocab_size {sizes[1]} but the student has {sizes[0]}; "
                          f"distillation compares whole next-token distributions, so the teacher needs the student's tokenizer")
    if student:
        _check_same_tokenizer(where, run.halo.model_name_or_path, path)
    try:
        plan_layout(teacher_parallel(run, args, teacher), teacher, discover(), world)
    except HaloError as exc:
        raise ConfigError(f"{where}: the teacher ({path}) cannot take its layout: {exc}; set {' / '.join(TEACHER_KEYS.values())}") from None


def _check_same_tokenizer(where: str, student_path: str, teacher_path: str) -> None:
    from pathlib import Path

    from transformers import AutoTokenizer

    if not (Path(teacher_path) / "tokenizer_config.json").exists() and not (Path(teacher_path) / "tokenizer.json").exists():
        return  # no tokenizer of its own: it reads the student's
    student, teacher = AutoTokenizer.from_pretrained(student_path), AutoTokenizer.from_pretrained(teacher_path)
    if student.get_vocab() != teacher.get_vocab():
        differ = sorted(set(student.get_vocab().items()) ^ set(teacher.get_vocab().items()))[:3]
        raise ConfigError(f"{where}: teacher_model_name_or_path {teacher_path} has another tokenizer than the student (they differ at "
                          f"{differ}); distillation compares next-token distributions token by token, so both need the same one")


METHOD = Method(name="distill", config_class=HaloDistillConfig, run=run, trainer=HaloDistillTrainer, splits=frozenset({"ep", "cp", "tp", "etp"}),
                columns=("messages|completion",), check=check)
