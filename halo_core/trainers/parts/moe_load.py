"""Tokens per expert, per MoE layer, over the global batch: ``moe/load_max``, ``moe/load_cv``, ``moe/dead_experts``.

Routing collapse is what fails first in MoE training, and a loss curve does not show it. The seam is transformers'
experts interface, the same for every family (``forward(hidden_states, top_k_index, top_k_weights)``, also under
Halo's EP/ETP, which replace the computation behind it): a forward pre-hook on each experts module adds its
``top_k_index`` into a per-layer count on the device. Nothing is read back until the trainer logs; then one
all-reduce sums the counts over every rank.

What counts: the tokens the model routes for the training batch, each once. Padding does not (the router sees it; a
per-token mask from the batch's ``attention_mask`` leaves it out). A CP rank routes its chunk of each pooled sequence
(the ranks' chunks add up); the TP ranks of a group route the same tokens, so the sum is divided by ``tp``. A
layer counts once per micro-batch (gradient checkpointing runs the forward again in backward), and evaluation and
reference forwards do not count.
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
from torch import nn

from halo_core.errors import LayoutError
from halo_core.layout import has_interface_signature
from halo_core.parallel.expert_parallel import count_experts, is_interface
from halo_core.parallel.layout_state import shard_of

#: Per-layer counts of each logging window, one JSON line per log, in ``output_dir``.
COUNTS_FILE = "moe_load.jsonl"
_INDEX_NAMES = ("top_k_index", "router_indices")


def experts_modules(model: nn.Module) -> list[tuple[str, nn.Module, int]]:
    """Every experts module at the interface (decorated or called as it is), with its whole model's expert count."""
    found = []
    for name, module in model.named_modules():
        if not (is_interface(module) or has_interface_signature(module)):
            continue
        try:
            total = getattr(shard_of(module), "num_experts", None) or count_experts(module)
        except LayoutError:  # called as the interface is, but no expert weights the core can count: not counted
            continue
        found.append((name, module, int(total)))
    return found


class MoeLoad:
    """The counts of one laid-out model, filled by its experts' pre-hooks while ``active``."""

    def __init__(self, modules: list[tuple[str, nn.Module, int]], layout) -> None:
        self.names = [name for name, _, _ in modules]
        self.sizes = [size for _, _, size in modules]
        self.layout = layout
        self.counts: list[torch.Tensor | None] = [None] * len(modules)
        self.active = False
        self.mask: torch.Tensor | None = None
        self.seen: set[int] = set()
        #: Also count per optimizer step (``parts.moe_bias`` balances by each step's loads).
        self.track_steps = False
        self.written = False  # this run wrote its first line of ``COUNTS_FILE``
        self.step_counts: list[torch.Tensor | None] = [None] * len(modules)
        self.handles = [module.register_forward_pre_hook(self._hook(i), with_kwargs=True) for i, (_, module, _) in enumerate(modules)]

    # -- filling ---------------------------------------------------------------------------------

    def begin(self, mask: torch.Tensor | None, training: bool) -> None:
        """A micro-batch starts: ``mask`` marks the tokens this rank's forward routes (``None``: all of them)."""
        self.active, self.mask, self.seen = training, mask, set()

    def _hook(self, layer: int):
        # Outside compiled layers' graphs (``compile_layers``): the once-per-micro-batch check is Python state that
        # would otherwise be guarded on, recompiling the layer as it changes.
        @torch.compiler.disable
        def hook(module, args, kwargs):
            if not self.active or layer in self.seen:
                return None
            index = args[1] if len(args) > 1 else next((kwargs[k] for k in _INDEX_NAMES if k in kwargs), None)
            if index is None:
                return None
            self.seen.add(layer)
            self._add(layer, index.detach())
            return None

        return hook

    def _add(self, layer: int, index: torch.Tensor) -> None:
        size = self.sizes[layer]
        tokens = index.reshape(index.shape[0], -1) if index.dim() > 1 else index.reshape(-1, 1)
        weight = torch.ones_like(tokens, dtype=torch.float64)
        if self.mask is not None and self.mask.numel() == tokens.shape[0]:
            weight = weight * self.mask.reshape(-1, 1).to(device=weight.device, dtype=weight.dtype)
        ids = tokens.long()
        ids = torch.where((ids >= 0) & (ids < size), ids, size)  # a router's "skip" class: its own bin, dropped
        counts = torch.zeros(size + 1, dtype=torch.float64, device=ids.device).scatter_add_(0, ids.reshape(-1), weight.reshape(-1))[:size]
        self.counts[layer] = counts if self.counts[layer] is None else self.counts[layer] + counts
        if self.track_steps:
            self.step_counts[layer] = counts if self.step_counts[layer] is None else self.step_counts[layer] + counts

    # -- reading ---------------------------------------------------------------------------------

    def _table(self, held: list, device: torch.device) -> torch.Tensor:
        """This rank's counts as one ``[layers, experts]`` tensor (the widest layer's width), on ``device``."""
        table = torch.zeros(len(self.sizes), max(self.sizes), dtype=torch.float64, device=device)
        for layer, counts in enumerate(held):
            if counts is not None:
                table[layer, : counts.shape[0]] = counts.to(device)
        return table

    def step_table(self, device: torch.device) -> torch.Tensor:
        """This rank's counts since the last optimizer step, then reset (summed over ranks by the caller)."""
        table, self.step_counts = self._table(self.step_counts, device), [None] * len(self.sizes)
        return table

    def drain(self, device: torch.device) -> tuple[dict[str, float], list[list[int]]]:
        """The metrics since the last call and the per-layer counts over the global batch (every rank calls)."""
        table, self.counts = self._table(self.counts, device), [None] * len(self.sizes)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(table)
            table = table / self.layout.dims.tp  # the TP ranks of a group routed the same tokens
        rows = [table[layer, :size].round().long().tolist() for layer, size in enumerate(self.sizes)]
        return load_metrics(rows), rows


def load_metrics(rows: list[list[int]]) -> dict[str, float]:
    """``moe/load_max``: the busiest expert's tokens over the mean of its layer, the largest over layers;
    ``moe/load_cv``: standard deviation over mean of tokens per expert (population), averaged over layers;
    ``moe/dead_experts``: the share of (layer, expert) pairs that got no token. Layers with no tokens count 0 for
    the first two."""
    peaks, cvs, dead, pairs = [], [], 0, 0
    for counts in rows:
        values = torch.tensor(counts, dtype=torch.float64)
        mean = values.mean()
        peaks.append(float(values.max() / mean) if mean > 0 else 0.0)
        cvs.append(float(values.std(correction=0) / mean) if mean > 0 else 0.0)
        dead += int((values == 0).sum())
        pairs += len(counts)
    return {"moe/load_max": max(peaks), "moe/load_cv": sum(cvs) / len(cvs), "moe/dead_experts": dead / pairs}


def write_counts(folder: str, step: int, names: list[str], rows: list[list[int]], first: bool = False) -> None:
    """One line per log: the step, and each layer's tokens per expert (the heatmap's input, ``bench/moe_heatmap.py``).

    ``first`` (this run's first line): lines from step ``step`` on are dropped, so a resumed run continues its
    history without the lines of steps it trains again, and a fresh start into the folder begins a new file."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, COUNTS_FILE)
    if first and os.path.exists(path):
        with open(path) as file:
            kept = [line for line in file if line.strip() and json.loads(line).get("step", 0) < step]
        with open(path, "w") as file:
            file.writelines(kept)
    with open(path, "a") as file:
        file.write(json.dumps({"step": step, "layers": names, "counts": rows}) + "\n")


def install(model: nn.Module, layout) -> MoeLoad | None:
    """Counts for ``model``'s experts modules, or ``None`` for a model without any."""
    modules = experts_modules(model)
    return MoeLoad(modules, layout) if modules else None


# -- this rank's token mask -----------------------------------------------------------------------


def _gather_padded(tensor: torch.Tensor, length: int, group) -> torch.Tensor:
    padded = tensor.new_zeros(tensor.shape[0], length)
    padded[:, : tensor.shape[1]] = tensor
    pieces = [torch.empty_like(padded) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, padded, group=group)
    return torch.cat(pieces, dim=0)


def split_mask(inputs: dict, layout) -> torch.Tensor | None:
    """The real tokens of this rank's share of its CP x TP group's pooled rows, as ``parts.context`` splits them:
    the group's attention masks padded to the pooled length (a multiple of ``cp``), then this rank's CP chunk.
    ``None`` for packed rows (no attention mask: every token is real)."""
    mask = inputs.get("attention_mask")
    if mask is None or mask.dim() != 2:
        return None
    cp, group = layout.dims.cp, layout.group("sample")
    longest = torch.tensor(mask.shape[1], device=mask.device)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group)
    length = -(-int(longest) // cp) * cp
    pooled = _gather_padded(mask.long(), length, group)
    rank = layout.coordinates()["cp"]
    return pooled[:, rank * length // cp : (rank + 1) * length // cp]


# -- the trainer's two calls ------------------------------------------------------------------------


def begin(trainer, model, inputs) -> None:
    """Before a micro-batch's forward: which tokens this rank routes, or nothing counted outside training."""
    load = getattr(trainer, "_halo_moe", None)
    if load is None:
        return
    if not model.training:
        load.begin(None, False)
        return
    layout = load.layout
    shared = layout.dims.cp * layout.dims.tp > 1 and not trainer.halo_shared_batch
    if shared and not trainer.halo_sequence_loss and hasattr(inputs, "get"):
        mask = split_mask(inputs, layout)
    else:  # this rank's own rows (a pooled batch's mask fits where the pool is not chunked over CP)
        mask = inputs.get("attention_mask") if hasattr(inputs, "get") else None
    load.begin(mask, True)


def log(trainer, logs: dict) -> None:
    """At a logging step (every rank): the metrics into ``logs``, the per-layer counts into ``COUNTS_FILE``."""
    load = getattr(trainer, "_halo_moe", None)
    if load is None or "loss" not in logs:
        return
    metrics, rows = load.drain(trainer.args.device)
    logs.update(metrics)
    if trainer.args.should_save:
        write_counts(trainer.args.output_dir, trainer.state.global_step, load.names, rows, first=not load.written)
        load.written = True
