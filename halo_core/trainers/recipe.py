"""The worker's model recipe: the steps that turn a launched run into its trainer, in the order they run (``build``).

1. ``load``: the model from its checkpoint, read straight into the layout, or from its config (random init, the
   same on every rank): ``runtime.build_model``.
2. ``lay_out``: ``parallelize``, the family's hooks then FSDP2 over the data-parallel ranks (step 1 did it for a
   checkpoint).
3. ``adapters``: LoRA (``use_peft``) on the laid-out model: ``runtime.with_adapters``.
4. ``frozen``: the reference policy and distill's teacher, each built and laid out, resharded after every forward.
5. ``compile``: ``compile_layers``, each decoder layer's forward, and the reference's under the same compilation
   where the trainer says so (``halo_compiles_reference``: DPO, KTO; GRPO's runs eager).
6. ``trainer``: the method's trainer over those models; after its ``__init__``, where TRL adds its fused LM head,
   ``split_head`` splits that head's sequences over CP.

A trainer built straight on a model (tests, bench scripts) gets steps 2, 5 and the split from the mixin instead
(``for_direct_trainer``); a model ``build`` made is marked, and the mixin leaves it as it is.
"""

from __future__ import annotations

from torch import nn

from halo_core.parallel.config import ParallelConfig
from halo_core.parallel.layout_state import laid_out
from halo_core.trainers.parts.layout import keep_from_accelerate, lay_out

#: Set on a model ``build`` made: its layout and compilation are done, and the trainer's head is split after ``__init__``.
_MADE = "_halo_recipe_made"


def build(run, args, parallel: ParallelConfig, trainer_class, processing_class, *, labels: int | None = None,
          reference: bool = False, frozen=None, **trainer_kwargs):
    """The trainer of a launched run, its models made in the recipe's order (module docstring).

    ``labels``: a sequence-classification model with that many outputs; ``reference``: the method keeps a frozen
    reference policy (``ref_model``); ``frozen(args, parallel)``: more frozen models, ``{keyword: (model, its
    ParallelConfig)}``. ``trainer_kwargs`` go to the trainer as they are."""
    from halo_core.trainers import runtime

    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    model = runtime.build_model(run.halo, args, parallel, labels, tokenizer.pad_token_id if labels is not None else None)  # 1
    model = lay_out(model, parallel)  # 2
    model = runtime.with_adapters(model, run, args, processing_class)  # 3
    frozen_models = {}  # 4
    if reference:
        frozen_models["ref_model"] = runtime.lay_out_frozen(runtime.build_reference(run.halo, args, parallel), parallel)
    for keyword, (model_of_keyword, its_parallel) in (frozen(args, parallel) if frozen else {}).items():
        frozen_models[keyword] = runtime.lay_out_frozen(model_of_keyword, its_parallel)
    if run.halo.compile_layers:  # 5
        compile_layers(model, run.halo.activation_memory_budget, frozen_models.get("ref_model") if trainer_class.halo_compiles_reference else None)
    setattr(laid_out(model), _MADE, True)
    trainer = trainer_class(model=model, args=args, processing_class=processing_class, parallel_config=parallel,  # 6
                            **frozen_models, **trainer_kwargs)
    split_head(trainer)
    return trainer


def compile_layers(model: nn.Module, activation_memory_budget: float | None, reference: nn.Module | None) -> None:
    """Step 5: regional compilation of the laid-out model (``parts/compile``), a reference beside it."""
    from halo_core.trainers.parts.compile import compile_decoder_layers

    compile_decoder_layers(laid_out(model), activation_memory_budget, frozen=reference)


def split_head(trainer) -> None:
    """Step 6, after the trainer's ``__init__``: a sequence-level method's fused LM head (TRL adds it there) run on
    each rank's chunk of the sequences under CP, the policy's and the reference's (``parts/pool``)."""
    from halo_core.trainers.parts.pool import split_fused_head_over_cp

    if trainer.halo_sequence_loss:
        for model in (trainer.model, getattr(trainer, "ref_model", None)):
            if model is not None and hasattr(model, "get_output_embeddings"):
                split_fused_head_over_cp(model, trainer._halo_pad_token_id())


def made(model: nn.Module) -> bool:
    """Whether ``build`` made ``model`` (or the model a wrapper holds): its steps 2 to 5 ran, and 6's split will."""
    return getattr(laid_out(model), _MADE, False)


def for_direct_trainer(kwargs: dict, parallel: ParallelConfig, compile_layers_asked: bool, activation_memory_budget: float | None) -> bool:
    """The fallback for a trainer built straight on a model (tests, bench scripts), in the mixin's constructor: steps
    2 and 5 on ``kwargs``' ``model`` and ``ref_model``, in place. Returns whether the trainer still owes step 6's
    split after its ``__init__``: not for a model ``build`` made, which is left laid out and compiled as it is (a
    wrapper of it, embed's, is only kept from Accelerate)."""
    if made(kwargs["model"]):
        keep_from_accelerate(kwargs["model"])
        return False
    kwargs["model"] = lay_out(kwargs["model"], parallel)
    reference = kwargs.get("ref_model")
    if reference is not None:
        kwargs["ref_model"] = reference = lay_out(reference, parallel)
    if compile_layers_asked:
        compile_layers(kwargs["model"], activation_memory_budget, reference)
    return True
