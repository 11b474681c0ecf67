"""What TRL's ``precompute_ref_log_probs`` needs on a Halo layout (the pass that scores the data
with the policy itself before training, when no reference model is kept).

The cache key. TRL keys that cache (``precompute_ref_log_probs``) on ``trl.trainer.utils.hash_module``, which reads
every state-dict tensor with ``.numpy()`` and so fails on the DTensor shards of a Halo layout. Here each
rank hashes its own shards and the ranks' digests are hashed together: every weight counts, no full
tensor is built, and every rank gets the same key (TRL then broadcasts rank 0's anyway).

The shards. The pass runs the policy forward before the optimizer exists; FSDP2 leaves the units built
with ``reshard_after_forward=False`` (the root, the output head) gathered after a forward, so the
optimizer would be built on the gathered tensors instead of the sharded parameters. ``reshard``
puts them back.
"""

from __future__ import annotations

import contextlib
import hashlib
from unittest import mock

import torch
import torch.distributed as dist

_WIDENED = (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)  # numpy has no such dtypes


def layout_hash(module: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        local = local.detach().cpu()
        digest.update(f"{name}:{local.dtype}:{tuple(local.shape)}".encode())
        digest.update((local.float() if local.dtype in _WIDENED else local).contiguous().numpy().tobytes())
    mine = digest.hexdigest()
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return hashlib.sha256("".join(everyone).encode()).hexdigest()


@contextlib.contextmanager
def hashing_layouts(trainer_module):
    """Within the block, ``trainer_module.hash_module`` (a TRL trainer's module) is ``layout_hash``."""
    with mock.patch.object(trainer_module, "hash_module", layout_hash):
        yield


def reshard(model: torch.nn.Module) -> None:
    """Every FSDP2 unit of ``model`` back to its shards (a no-op where one already is)."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
