"""What every method's worker does first: join the process group, build the tokenizer and the model."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from halo_core.parallel.config import ParallelConfig
from halo_core.trainers.arguments import HaloArguments


def init_distributed() -> None:
    """Join the group ``torch.distributed.run`` describes (gloo on CPU, NCCL on GPUs); no-op in one process."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")


def method_args(config_class, fields: dict):
    """The method's TRL/transformers config; without a GPU it runs on the CPU (gloo) automatically."""
    if not torch.cuda.is_available():
        fields = {"use_cpu": True, **fields}
    return config_class(**fields)


def build_tokenizer(halo: HaloArguments):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(halo.model_name_or_path)


def build_model(halo: HaloArguments, args, parallel: ParallelConfig):
    """Random init from the config (same seed on every rank), or the checkpoint read straight into the layout."""
    from transformers import AutoConfig

    from halo_core.kernels import liger
    from halo_core.parallel.loading import from_pretrained, model_class_for

    dtype = torch.bfloat16 if args.bf16 else torch.float32
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() and not args.use_cpu else torch.device("cpu")
    experts = halo.experts_implementation
    if experts == liger.EXPERTS_IMPLEMENTATION:
        liger.register()
    if halo.random_init:
        config = AutoConfig.from_pretrained(halo.model_name_or_path)
        torch.manual_seed(args.seed)
        with device:
            model = model_class_for(config).from_config(config, dtype=dtype, **({"experts_implementation": experts} if experts else {}))
    else:
        model = from_pretrained(halo.model_name_or_path, parallel, dtype=dtype, device=device, experts_implementation=experts)
    if experts == liger.EXPERTS_IMPLEMENTATION:
        liger.check_experts(model)
    return model
