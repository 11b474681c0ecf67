"""The optimizer step overlapped with the next step's forward (``overlap_optimizer_step``), exactly.

The step runs after backward and clipping, as without overlap, but on a side CUDA stream, in forward order: the
parameters outside the decoder layers first (embeddings, final norm, head), then each layer's. Each part records an
event; the next forward waits for a part's event just before the module that reads it (a forward pre-hook on the
model and on each decoder layer), so layer k's forward runs while layers k+1.. are still being stepped. Same kernels,
same order of operations per parameter, same random bits: the weights are bitwise those of the step without overlap.
Anything else that reads the weights between steps (saving, weight sync) calls ``wait``.

Only without FSDP2 units (``shard_parameters: false``; on one GPU FSDP2 shards nothing anyway): FSDP2 gathers a
unit's parameters on its own streams, which sync with the compute stream once per forward (at the root), not per unit.
"""

from __future__ import annotations

import torch
from torch import nn

from halo_core.parallel.fsdp import decoder_layers


class OverlappedStep:
    """The parts of ``model``'s parameters in forward order, the side stream, one event per part, and the hooks."""

    def __init__(self, model: nn.Module):
        self.stream = torch.cuda.Stream()
        layers = decoder_layers(model)
        owner = {}
        for index, layer in enumerate(layers, start=1):
            for param in layer.parameters():
                owner[param] = index
        self.part_of = {param: owner.get(param, 0) for param in model.parameters()}
        self.events = [torch.cuda.Event() for _ in range(len(layers) + 1)]
        self.pending = False
        model.register_forward_pre_hook(self._waiter(0), prepend=True)
        for index, layer in enumerate(layers, start=1):
            layer.register_forward_pre_hook(self._waiter(index), prepend=True)

    def _waiter(self, part: int):
        def wait_for_part(module, args):
            if self.pending:
                torch.cuda.current_stream().wait_event(self.events[part])
        return wait_for_part

    def order(self, params: list) -> list:
        """``params`` (``(index, param)`` pairs) sorted into forward order, stable within a part."""
        return sorted(params, key=lambda item: self.part_of.get(item[1], 0))

    def begin(self) -> None:
        self.stream.wait_stream(torch.cuda.current_stream())  # the gradients, the clipping factor

    def end_part(self, part: int) -> None:
        self.events[part].record(self.stream)
        self.pending = True

    def wait(self) -> None:
        """Make the current stream wait for the whole last step (before the weights are read outside a forward)."""
        if self.pending:
            torch.cuda.current_stream().wait_stream(self.stream)
