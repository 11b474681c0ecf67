"""FSDP2 over what the other splits leave: the data-parallel ranks.

Experts are sharded over the ranks that hold the same expert block (``ep_replicate``);
everything else over all data-parallel ranks, one FSDP unit per decoder layer (the
model's own ``_no_split_modules``) plus the root. The expert units divide their reduced
gradients by the data-parallel size rather than their own group's size, because each
expert block's gradient already sums its EP group's tokens (see ``grads``).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from halo_core.parallel.config import ParallelDims


def data_parallel_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The 1-D mesh of every data-parallel rank."""
    return mesh["ep_replicate", "ep"]._flatten("dp")


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def apply_fsdp(model: nn.Module, dims: ParallelDims, mesh: DeviceMesh, expert_modules: list[nn.Module]) -> None:
    for experts in expert_modules:
        fully_shard(experts, mesh=mesh["ep_replicate"])
        # Sum only (no PREMUL_SUM, which gloo lacks); sync_gradients divides by the data-parallel size.
        experts.set_gradient_divide_factor(1.0)
        experts.set_force_sum_reduction_for_comms(True)
    dp_mesh = data_parallel_mesh(mesh)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
