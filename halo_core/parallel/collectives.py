"""Collectives under the names current torch gives them, falling back where an older torch (>= 2.11) lacks them."""

from __future__ import annotations

import torch.distributed as dist

#: ``all_gather_into_tensor`` warns that it is deprecated from torch 2.13 on; same arguments.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
