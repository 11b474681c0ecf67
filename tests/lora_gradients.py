"""Adapter gradients of one step of a family's tiny model, on one process or a spawned layout (test_lora_families)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

TARGETS = dict(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "o_proj"], target_parameters=["experts.gate_up_proj", "experts.down_proj"])


def gradients(rank: int, world: int, model_type: str, layout: dict, adapter: str, out: str) -> None:
    """Build, lay out, add adapters, load ``adapter`` (nonzero values), one backward over this rank's rows of a fixed
    batch of equal-length rows; rank 0 saves every adapter gradient, joined, to ``out``."""
    from peft import LoraConfig

    from halo_core.lora import peft_format
    from halo_core.lora.inject import add_adapters
    from halo_core.parallel.config import ParallelConfig
    from halo_core.parallel.grads import sync_gradients
    from halo_core.parallel.parallelize import parallelize
    from halo_core.parallel.state_dict import gather_full
    from halo_core.registry import discover
    from halo_core.tiny import tiny_family_model

    record = discover().family_record(model_type)
    torch.manual_seed(0)
    model = parallelize(tiny_family_model(record.family, model_type), ParallelConfig(**layout))
    add_adapters(model, LoraConfig(**TARGETS), seed=3)
    peft_format.load_adapter(model, adapter)
    torch.manual_seed(7)
    rows = torch.randint(3, 120, (4, 10))
    mine = rows.chunk(world)[rank] if world > 1 else rows
    model(input_ids=mine, labels=mine).loss.backward()
    sync_gradients(model)
    joined = gather_full(model, [(n, p.grad) for n, p in model.named_parameters() if p.requires_grad], device="cpu")
    if rank == 0:
        torch.save(joined, out)


def random_adapter(model_type: str, folder: Path) -> str:
    """An adapter file of nonzero values for ``model_type``'s tiny model under ``TARGETS``."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    from halo_core.lora import peft_format
    from halo_core.lora.inject import add_adapters
    from halo_core.parallel.config import ParallelConfig
    from halo_core.parallel.parallelize import parallelize
    from halo_core.registry import discover
    from halo_core.tiny import tiny_family_model

    record = discover().family_record(model_type)
    model = parallelize(tiny_family_model(record.family, model_type), ParallelConfig())
    add_adapters(model, LoraConfig(**TARGETS), seed=3)
    generator = torch.Generator().manual_seed(1)
    state = {k: torch.randn(v.shape, generator=generator) * 0.05 for k, v in peft_format.adapter_state(model).items()}
    save_file(state, str(folder / peft_format.ADAPTER_WEIGHTS))
    return str(folder)
