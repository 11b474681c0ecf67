"""What the methods that keep a reference policy (DPO, KTO, GRPO) share beside TRL's own handling of it."""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

from halo_core.parallel.dtensor import local


def hash_laid_out(module: torch.nn.Module) -> str:
    """TRL's ``hash_module`` over a laid-out model: each rank hashes its local shards, and the ranks' digests
    are hashed together, so the name changes whenever any rank's weights do."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        tensor = local(tensor).detach().cpu()
        digest.update(name.encode() + str(tensor.dtype).encode())
        digest.update((tensor.float() if tensor.dtype != torch.float32 else tensor).contiguous().numpy().tobytes())
    mine = digest.hexdigest()
    if not dist.is_initialized():
        return mine
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return hashlib.sha256("".join(every).encode()).hexdigest()
