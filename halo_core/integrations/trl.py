"""TRL's private parts Halo uses: trainer methods its GRPO, SDPG, KTO and SMPO override or call, attributes they read,
and the two module functions patched while a trainer's ``__init__`` runs (no public hook takes a reference model that
is already laid out, nor a cache key for a sharded one)."""

from __future__ import annotations

from contextlib import contextmanager

import trl.trainer.dpo_trainer
import trl.trainer.grpo_trainer
import trl.trainer.kto_trainer

from halo_core.integrations import Seam, check

_GRPO, _DPO, _KTO, _SFT = "trl:GRPOTrainer", "trl:DPOTrainer", "trl:KTOTrainer", "trl:SFTTrainer"

SEAMS = (
    # methods/grpo.py (and sdpg.py over it): generation through Halo's rollout engines, TP pooling, the CP logps.
    Seam(_GRPO, "_generate_single_turn", ("prompt_ids", "images", "multimodal_fields", "num_generations")),
    Seam(_GRPO, "_prepare_inputs", ("generation_batch",)),
    Seam(_GRPO, "_generate_and_score_completions", ("inputs",)),
    Seam(_GRPO, "_get_per_token_logps_and_entropies", ("model", "input_ids", "attention_mask", "logits_to_keep", "batch_size")),
    Seam(_GRPO, "_compute_loss", ("model", "inputs")),
    Seam(_GRPO, "_tokenize_prompts", ("prompts",)),
    Seam(_GRPO, "_buffered_inputs", assigned_in=True),
    Seam(_GRPO, "_step", assigned_in=True),
    Seam(_GRPO, "_tokenizer", assigned_in=True),
    Seam(_GRPO, "_metrics", assigned_in=True),
    # methods/smpo.py replaces DPO's loss; methods/kto.py post-processes KTO's tokenized dataset.
    Seam(_DPO, "_compute_loss", ("model", "inputs", "return_outputs")),
    Seam(_DPO, "_metrics", assigned_in=True),
    Seam(_KTO, "_prepare_dataset", ("dataset", "processing_class", "args", "dataset_name")),
    # The mixin and methods/sft.py count tokens and log metrics as SFTTrainer keeps them.
    Seam(_SFT, "_metrics", assigned_in=True),
    Seam(_SFT, "_total_train_tokens", assigned_in=True),
    Seam(_SFT, "_is_vision_dataset", assigned_in=True),
    # The two module functions patched below.
    Seam("trl.trainer.grpo_trainer", "create_model_from_path", ("model_id",)),
    Seam("trl.trainer.dpo_trainer", "create_model_from_path", ("model_id",)),
    Seam("trl.trainer.dpo_trainer", "hash_module", ("module",)),
    Seam("trl.trainer.kto_trainer", "hash_module", ("module",)),
)

check("trl", SEAMS)

#: The trainer modules whose module functions are patched (``reference_given``, ``hashing_shards``).
grpo_trainer, dpo_trainer, kto_trainer = trl.trainer.grpo_trainer, trl.trainer.dpo_trainer, trl.trainer.kto_trainer


@contextmanager
def reference_given(trainer_module, reference):
    """While a TRL trainer's ``__init__`` runs: it builds its reference from the policy's hub id
    (``create_model_from_path``); hand it ``reference`` instead, Halo's laid-out copy, or ``None`` for none."""
    original = trainer_module.create_model_from_path
    trainer_module.create_model_from_path = lambda *args, **kwargs: reference
    try:
        yield
    finally:
        trainer_module.create_model_from_path = original


@contextmanager
def hashing_shards(trainer_module):
    """While a TRL trainer's ``__init__`` runs: it names the cache of precomputed reference log-probs after
    ``hash_module(model)``, whose ``.numpy()`` DTensor parameters refuse; hash the layout's shards instead."""
    from halo_core.methods.reference import hash_laid_out

    original = trainer_module.hash_module
    trainer_module.hash_module = hash_laid_out
    try:
        yield
    finally:
        trainer_module.hash_module = original
