"""Expert token dispatch: moves (token, expert) pairs to the ranks owning the experts and back.

Back-ends are found by name through the entry-point group ``halo.dispatchers`` (the
core registers ``torch`` there); a back-end is a class taking the EP process group and
implementing :class:`TokenDispatcher`. DeepEP, symmetric-memory all-to-all and the like
plug in as small separate packages.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single_autograd

from halo_core.errors import HaloError

ENTRY_POINT_GROUP = "halo.dispatchers"


class DispatcherError(HaloError):
    """An unknown or unavailable ``ep_dispatcher``."""


class TokenDispatcher(Protocol):
    def __init__(self, group: Any) -> None: ...

    def dispatch(self, tokens: torch.Tensor, expert_ids: torch.Tensor, send_counts: list[int]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Send ``tokens`` (grouped by destination rank, ``send_counts[r]`` rows for rank r) with their
        local expert ids; return the received tokens, their local expert ids, and a handle for ``combine``.
        Differentiable in ``tokens``."""

    def combine(self, expert_output: torch.Tensor, handle: Any) -> torch.Tensor:
        """Return each received row's output to its source rank, in the order it was sent. Differentiable."""


class TorchAllToAll:
    """``all_to_all_single`` with split sizes exchanged each step; works on gloo (CPU) and NCCL."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def dispatch(self, tokens, expert_ids, send_counts):
        send = torch.tensor(send_counts, dtype=torch.int64, device=tokens.device)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        recv_counts = recv.tolist()
        received = all_to_all_single_autograd(tokens.contiguous(), recv_counts, send_counts, self.group)
        received_ids = expert_ids.new_empty(sum(recv_counts))
        dist.all_to_all_single(received_ids, expert_ids.contiguous(), recv_counts, send_counts, group=self.group)
        return received, received_ids, (send_counts, recv_counts)

    def combine(self, expert_output, handle):
        send_counts, recv_counts = handle
        return all_to_all_single_autograd(expert_output.contiguous(), send_counts, recv_counts, self.group)


def available_dispatchers() -> dict[str, Any]:
    """Installed back-ends by name (entry points, not yet loaded)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def get_dispatcher(name: str) -> type:
    """The dispatcher class called ``name``; a clear error lists the available ones."""
    available = available_dispatchers()
    if name not in available:
        raise DispatcherError(
            f"ep_dispatcher={name!r} is unknown; available: {sorted(available)}. Install the package that "
            f"provides it (entry-point group {ENTRY_POINT_GROUP!r}) or pick one of those"
        )
    try:
        return available[name].load()
    except Exception as exc:
        raise DispatcherError(
            f"ep_dispatcher={name!r} is installed but unavailable here ({type(exc).__name__}: {exc}); "
            f"available: {sorted(available)}"
        ) from exc
