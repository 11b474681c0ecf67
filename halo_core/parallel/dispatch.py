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

from halo_core.errors import HaloError
from halo_core.parallel import row_exchange

ENTRY_POINT_GROUP = "halo.dispatchers"


class DispatcherError(HaloError):
    """An unknown or unavailable ``ep_dispatcher``."""


class TokenDispatcher(Protocol):
    def __init__(self, group: Any) -> None: ...

    def dispatch(self, tokens: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Send each rank its (token, expert) pairs.

        ``counts`` (on the tokens' device, int64, shape ``(ep_size, experts_per_rank)``): how many
        pairs go to each rank's each local expert; ``tokens`` holds them in that order (by rank,
        then local expert), followed by rows sent nowhere, which are dropped. Return the received
        rows in the same grouping (by source rank, then local expert), the received counts in
        the same shape (row ``s``: what source ``s`` sent here), and a handle for ``combine``.
        Differentiable in ``tokens``."""

    def combine(self, expert_output: torch.Tensor, handle: Any) -> torch.Tensor:
        """Return each received row's output to its source rank: as many rows as ``tokens`` had, in
        the order sent, zero for the rows sent nowhere. Differentiable."""


class TorchAllToAll:
    """``all_to_all_single``: the per-expert counts are exchanged first (one small all-to-all and the
    layer's one read-back to the host, for the split sizes), then the tokens; works on gloo and NCCL.
    The exchanges are custom operators (``row_exchange``), so a compiled layer stays one graph."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def dispatch(self, tokens, counts):
        received_counts, sizes = row_exchange.exchange_counts(counts, self.group.group_name)
        received = row_exchange.send_rows(tokens, sizes, self.group.group_name)
        return received, received_counts, (sizes, tokens.shape[0])

    def combine(self, expert_output, handle):
        sizes, total = handle
        return row_exchange.return_rows(expert_output, sizes, self.group.group_name, total)


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
