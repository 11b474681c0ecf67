"""What every method's worker does first: join the process group, build the tokenizer (or processor) and the model."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from halo_core.parallel.config import ParallelConfig
from halo_core.trainers.arguments import HaloArguments
from halo_core.trainers.parts import model_card


def init_distributed(timeout_s: float | None = None) -> None:
    """Join the group ``torch.distributed.run`` describes (gloo on CPU, NCCL on GPUs); no-op in one process.
    ``timeout_s``: how long any collective of the run may wait (``ddp_timeout``, ``parts/collective_timeout.py``)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=timeout)
        if timeout is not None:
            from halo_core.trainers.parts.collective_timeout import apply_to_new_groups

            apply_to_new_groups(timeout)


def method_args(config_class, fields: dict):
    """The method's TRL/transformers config; without a GPU it runs on the CPU (gloo) automatically."""
    if not torch.cuda.is_available():
        fields = {"use_cpu": True, **fields}
    return config_class(**checkpointing_named(config_class, fields))


def checkpointing_named(config_class, fields: dict) -> dict:
    """``fields`` with TRL's default for activation checkpointing passed under transformers 5's name.

    TRL's configs default the deprecated ``gradient_checkpointing`` to True (on, as TRL intends) and leave
    ``activation_checkpointing`` unset; transformers then copies the old name over with a FutureWarning on every
    rank. Passing the same value under the new name keeps TRL's behaviour and its warning away; a run that sets
    either name itself is passed on as written (setting the old name still warns, as it should)."""
    import dataclasses

    if "activation_checkpointing" in fields or "gradient_checkpointing" in fields:
        return fields
    default = {f.name: f.default for f in dataclasses.fields(config_class)}.get("gradient_checkpointing")
    return fields if default is None else {**fields, "activation_checkpointing": default}


def build_model(halo: HaloArguments, args, parallel: ParallelConfig, num_labels: int | None = None, pad_token_id: int | None = None):
    """Random init from the config (same seed on every rank), or the checkpoint read straight into the layout.

    ``num_labels``: the family's backbone under a sequence-classification head (``score``) with that many
    outputs and ``pad_token_id`` on the config; from a causal LM's checkpoint the head starts from the seed.
    """
    from transformers import AutoConfig

    from halo_core.kernels import liger
    from halo_core.parallel.loading import build_from_config, from_pretrained, model_class_for, sequence_head

    dtype = torch.bfloat16 if args.bf16 else torch.float32
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() and not args.use_cpu else torch.device("cpu")
    experts = halo.experts_implementation
    if experts == liger.EXPERTS_IMPLEMENTATION:
        liger.register()
    if halo.random_init:
        config = AutoConfig.from_pretrained(halo.model_name_or_path)
        if num_labels is not None:
            sequence_head(config, num_labels, pad_token_id)
        torch.manual_seed(args.seed)
        with device:
            model = build_from_config(model_class_for(config, sequence_classification=num_labels is not None),
                                      config, dtype=dtype, **({"experts_implementation": experts} if experts else {}))
        model_card.mark_random_init(model)  # the card names its start (parts/model_card.py)
    else:
        model = from_pretrained(halo.model_name_or_path, parallel, dtype=dtype, device=device, experts_implementation=experts,
                                num_labels=num_labels, pad_token_id=pad_token_id, seed=args.seed)
    if experts == liger.EXPERTS_IMPLEMENTATION:
        liger.check_experts(model)
    name_the_backbone(model)
    use_attention(model, halo.attn_implementation, bool(getattr(args, "packing", False) or getattr(args, "padding_free", False)))
    return model


def use_attention(model, name: str | None, packed_documents: bool = True) -> None:
    """The run's ``attn_implementation`` (transformers' name) switched on the built model, after the loader laid it
    out: ``check_run`` refuses the key with context or tensor parallelism, whose attention wrapper takes the
    implementation when the layout is made. ``flash_attention_4`` runs Halo's operator-based function
    (``kernels/flash_attention``): measured on an H100 it is 1.24x transformers' own in a compiled 4k step and 1.02x at
    32k, with the same outputs (benchmarks.md, "FlashAttention on Hopper"). ``packed_documents``: rows may hold
    several documents (``packing``/``padding_free``), which only transformers' function separates."""
    if name == "flash_attention_4":
        from halo_core.kernels import flash_attention

        flash_attention.register(packed_documents)
    if name:
        model.set_attn_implementation(name)


def name_the_backbone(model) -> None:
    """TRL's fused LM head (SFT, DPO, ...) runs ``model.base_model``, which is the whole model where the class's
    ``base_model_prefix`` names no child: transformers' ``Llama4ForCausalLM`` says ``language_model`` and keeps its
    backbone at ``model``, so stock TRL fails on it. Point this instance's prefix at that child (checkpoints keep
    the class's names)."""
    from transformers import PreTrainedModel

    if model.base_model is model and isinstance(getattr(model, "model", None), PreTrainedModel):
        model.base_model_prefix = "model"


def build_reference(halo: HaloArguments, args, parallel: ParallelConfig):
    """The frozen reference policy of DPO/KTO: a second copy built as the policy is (same weights, same
    shards), in eval mode, with no gradients and so no optimizer state. Memory: one more copy of the
    weights per rank, laid out like the policy's (no gradients, no Adam moments)."""
    reference = build_model(halo, args, parallel)
    reference.requires_grad_(False)
    return reference.eval()


def train(run, trainer_class, config_class, *, reference=None, num_labels=None, frozen=None, **trainer_kwargs):
    """The road every method's worker takes: the method's config, the model (and a reference policy
    where the method keeps one), the trainer over the run's data, ``train`` (resuming where asked), the result.

    ``reference(args)``: whether the method keeps a frozen reference policy under these arguments.
    ``num_labels(args)``: a sequence-classification model with that many outputs (reward, classify).
    ``frozen(args, parallel)``: more frozen models the trainer takes, ``{keyword: (model, its ParallelConfig)}``
    (distill's teacher, laid out by its own degrees).
    Returns the trainer (its model is the trained, laid-out one). A collective that waits past ``ddp_timeout``
    ends it with one line naming the step (``parts/collective_timeout.py``).
    """
    from halo_core.trainers.parts import collective_timeout

    timeout_s = collective_timeout.seconds(run, config_class)
    init_distributed(timeout_s)
    with collective_timeout.Watch(timeout_s) as watch:
        return _train(run, trainer_class, config_class, watch, reference=reference, num_labels=num_labels, frozen=frozen, **trainer_kwargs)


def _train(run, trainer_class, config_class, watch, *, reference, num_labels, frozen, **trainer_kwargs):
    from halo_core.trainers.parts.evaluation import datasets_for
    from halo_core.trainers.parts.processor import build_processing_class

    args = method_args(config_class, run.trainer)
    parallel = run.halo.parallel_config()
    from halo_core.trainers.parts.mixture import prepare_args, seed_of

    dataset, eval_dataset = datasets_for(run, args.seed, seed_of(args))
    prepare_args(args, dataset)
    processing_class = build_processing_class(run.halo.model_name_or_path, dataset)  # a processor for image rows (SFT)
    from halo_core.trainers import recipe

    trainer = recipe.build(  # the model, its layout, adapters, frozen models, compilation, the trainer: in order
        run,
        args,
        parallel,
        trainer_class,
        processing_class,
        labels=num_labels(args) if num_labels is not None else None,
        reference=reference is not None and reference(args),
        frozen=frozen,
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        adamw_bf16_kahan=run.halo.adamw_bf16_kahan,
        overlap_optimizer_step=run.halo.overlap_optimizer_step,
        async_save=run.halo.async_save,
        max_nonfinite_skips=run.halo.max_nonfinite_skips,
        moe_bias_update_rate=run.halo.moe_bias_update_rate,
        **trainer_kwargs,
    )
    watch.trainer = trainer
    from halo_core.trainers.parts import tensor_bytes

    tensor_bytes.attach(trainer)
    with attention_backends(run.halo.sdpa_backends):
        trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.save_model()
    if run.halo.merge_adapter and run.peft.get("use_peft"):
        from halo_core.lora.merge import merge
        from halo_core.trainers.parts import checkpoint

        if checkpoint.rank() == 0:
            merge(args.output_dir, os.path.join(args.output_dir, "merged"))
        checkpoint.barrier()
    return trainer


#: ``sdpa_backends`` names -> PyTorch's back-ends.
SDPA_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}


def attention_backends(names: list[str]):
    """PyTorch's ``sdpa_kernel`` over these back-ends, tried in this order (``set_priority``); none: PyTorch's own.
    Compiled layers pick their kernel when traced, which happens inside it."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not names:
        return contextlib.nullcontext()
    return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[n]) for n in names], set_priority=True)


def lay_out_frozen(model, parallel: ParallelConfig):
    """A frozen model (reference, teacher) laid out, resharded after each forward: no backward ever reshards it, and
    without this its root unit (norm, head) would stay gathered between steps."""
    from halo_core.parallel.fsdp import reshard_all
    from halo_core.trainers.parts.layout import lay_out

    model = lay_out(model, parallel)
    model.register_forward_hook(lambda module, args, output: reshard_all(module))
    return model


def base_model_path(run, args) -> str:
    """What a LoRA run's adapter names as its base: the model folder (absolute) or hub id, or for a randomly
    initialised model the copy of its initial weights the run writes to ``OUTPUT_DIR/base``."""
    if run.halo.random_init:
        return os.path.abspath(os.path.join(args.output_dir, "base"))
    path = run.halo.model_name_or_path
    return os.path.abspath(path) if os.path.isdir(path) else path


def with_adapters(model, run, args, tokenizer):
    """The laid-out model with its LoRA adapters when the run sets ``use_peft`` (TRL's keys), else unchanged."""
    from halo_core.lora import settings

    config = settings.lora_config(run.peft)
    if config is None:
        return model
    from halo_core.lora.inject import add_adapters
    from halo_core.trainers.parts import checkpoint

    base = base_model_path(run, args)
    add_adapters(model, config, args.seed, base)
    if run.halo.random_init:  # the adapter's base must be loadable: its weights exist nowhere else
        checkpoint.save_model(model, base, tokenizer, base=True)
    if getattr(args, "activation_checkpointing", False):
        model.enable_input_require_grads()  # checkpointed layers whose inputs need no gradient would pass none back (TRL does the same)
    return model
