"""Sequence classification: ``HaloClassifyTrainer(DistributedTrainerMixin, transformers.Trainer)`` and the ``classify`` method.

The family's backbone under transformers' sequence-classification head (``score``, ``num_labels``
outputs read at the last non-pad token), trained with the model's own cross-entropy on ``text``,
``label`` rows; transformers' collator (``DataCollatorWithPadding``), loss and logging run unchanged.
The mixin pools a TP group's rows (``parts.pool``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from transformers import Trainer, TrainingArguments

from halo_core.errors import ConfigError
from halo_core.trainers.method import Method
from halo_core.trainers.mixin import DistributedTrainerMixin
from halo_core.trainers.run_config import RunConfig


@dataclass
class ClassifyConfig(TrainingArguments):
    """transformers' ``TrainingArguments`` plus what building and feeding the classifier needs."""

    num_labels: int | None = field(default=None, metadata={"help": "Classes (the head's outputs); labels are ints 0 .. num_labels - 1. Required."})
    trust_remote_code: bool = field(default=False, metadata={
        "help": "Run a model folder's own modeling code (config.json auto_map, a model type transformers does not know), as TRL's configs take it."})
    max_length: int | None = field(default=1024, metadata={"help": "Truncate each text to this many tokens; empty for no truncation."})


def tokenize_text(dataset, tokenizer, max_length: int | None):
    """``text`` -> ``input_ids``, ``attention_mask`` (truncated at ``max_length``), as a transformers user maps it."""
    if "input_ids" in dataset.column_names:
        return dataset
    encode = lambda batch: tokenizer(batch["text"], truncation=max_length is not None, max_length=max_length)  # noqa: E731
    return dataset.map(encode, batched=True, remove_columns=["text"])


class HaloClassifyTrainer(DistributedTrainerMixin, Trainer):
    """transformers' Trainer on a Halo layout, over ``text``, ``label`` rows."""

    halo_sequence_loss = True

    def __init__(self, *args, **kwargs):
        tokenizer, config = kwargs["processing_class"], kwargs["args"]
        if tokenizer.pad_token is None:  # as TRL does
            tokenizer.pad_token = tokenizer.eos_token
        kwargs["model"].config.get_text_config().pad_token_id = tokenizer.pad_token_id  # the head skips pads by it
        for key in ("train_dataset", "eval_dataset"):
            if kwargs.get(key) is not None:
                kwargs[key] = tokenize_text(kwargs[key], tokenizer, config.max_length)
        if kwargs.get("eval_dataset") is not None and kwargs.get("compute_metrics") is None:
            from halo_core.trainers.parts.evaluation import accuracy

            kwargs["compute_metrics"] = accuracy  # evaluation reports eval_accuracy beside eval_loss
        super().__init__(*args, **kwargs)
        # The head's loss is a mean over this batch's rows and takes no num_items_in_batch. Left True (the model
        # accepts **kwargs), Trainer would multiply the loss by the world size (average_tokens_across_devices) on top
        # of Halo's data-parallel average (sync_gradients), and skip the division by gradient_accumulation_steps.
        self.model_accepts_loss_kwargs = False


def run(run: RunConfig) -> None:
    from halo_core.trainers.runtime import train

    train(run, HaloClassifyTrainer, ClassifyConfig, num_labels=lambda args: args.num_labels)


def check_sequence_class(run: RunConfig) -> None:
    """A local model whose type transformers has a sequence-classification class for (a hub id is checked when loaded)."""
    if not (Path(run.halo.model_name_or_path) / "config.json").is_file():
        return
    from transformers import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING, AutoConfig

    config = AutoConfig.from_pretrained(run.halo.model_name_or_path)
    if type(config) not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING:
        raise ConfigError(
            f"{run.source}: model_name_or_path {run.halo.model_name_or_path!r} is a {config.model_type!r} model, for which "
            f"transformers has no sequence-classification class (AutoModelForSequenceClassification); method {run.method!r} "
            f"needs one: pick a model type it maps, or a causal-LM method (sft, dpo)"
        )


def check(run: RunConfig, args, world: int = 1) -> None:
    from halo_core.trainers.parts.data import first_rows

    fix = "set num_labels: N in the YAML (or -- --num_labels=N), N the number of classes, labels 0 .. N-1"
    if args.num_labels is None:
        raise ConfigError(f"{run.source}: num_labels is not set and method 'classify' needs it; {fix}")
    if args.num_labels < 2:
        raise ConfigError(
            f"{run.source}: num_labels={args.num_labels!r} must be at least 2 (transformers reads 1 as regression); {fix}, "
            f"or train a one-score model with method 'reward'"
        )
    for source in run.halo.dataset:
        for index, row in enumerate(first_rows(source) or ()):
            label = row.get("label")
            if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < args.num_labels:
                raise ConfigError(
                    f"{run.source}: dataset {source.path!r} row {index + 1} has label={label!r}, not an int in "
                    f"[0, {args.num_labels}) (num_labels={args.num_labels}); map the labels to 0 .. {args.num_labels - 1} "
                    f"or raise num_labels"
                )
    check_sequence_class(run)


# No cp: the score is read at each sequence's last non-pad token, which one CP chunk holds.
METHOD = Method(name="classify", config_class=ClassifyConfig, run=run, trainer=HaloClassifyTrainer, sequence_classification=True, splits=frozenset({"ep", "tp", "etp"}),
                columns=("text", "label"), check=check)
