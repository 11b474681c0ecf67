"""Routing replay: the experts a token was sent to when its log-probs were taken, chosen again in training.

Implemented at the router's ``torch.topk``, so it needs no code per family: while a router runs, a
``TorchFunctionMode`` records the indices each top-k call returns, or, replaying, returns the recorded
indices with the live values at them (``input.gather``). Whatever the router does after its top-k (renormalise,
gather the unbiased scores, scale) then runs on live scores at the recorded experts: the experts chosen are the
recorded ones and the router keeps its gradient (replaying the gate weights too would zero it). A router with
several top-k calls (group-limited routing: groups, then experts) is replayed call by call. A router that
calls no top-k cannot be replayed: its family declares ``routing_replay=False`` (the kit checks the declaration
with ``silent_routers``), and ``RoutingReplay`` refuses it when recording.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from halo_core.errors import HaloError

_TOPK = (torch.topk, torch.Tensor.topk)


class RoutingReplayError(HaloError):
    """A model whose routers routing replay cannot reach, or recorded routes that do not fit the pass."""


#: Router name -> one entry per forward call of the pass, each the indices of its top-k calls in order.
Routes = dict[str, list[list[torch.Tensor]]]


class _TopK(TorchFunctionMode):
    def __init__(self, recorded: list[torch.Tensor] | None):
        super().__init__()
        self.recorded = recorded
        self.seen: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _TOPK:
            return func(*args, **kwargs)
        if self.recorded is None:
            result = func(*args, **kwargs)
            self.seen.append(result.indices.detach())
            return result
        if len(self.seen) >= len(self.recorded):
            raise RoutingReplayError(f"a router made more top-k calls than were recorded ({len(self.recorded)})")
        indices = self.recorded[len(self.seen)]
        self.seen.append(indices)
        source = args[0]
        dim = kwargs.get("dim", args[2] if len(args) > 2 else -1)
        if indices.dim() != source.dim() or any(a != b for i, (a, b) in enumerate(zip(indices.shape, source.shape)) if i != dim % source.dim()):
            raise RoutingReplayError(f"recorded routes of shape {tuple(indices.shape)} do not fit this pass's scores {tuple(source.shape)}")
        return torch.return_types.topk((source.gather(dim, indices.to(source.device)), indices.to(source.device)))


class RoutingReplay:
    """Records and replays the routing of ``routers`` (name -> router module, the family's ``Family.router``)."""

    def __init__(self, routers: dict[str, nn.Module]):
        if not routers:
            raise RoutingReplayError("the model has no routers to replay (no MoE blocks as its family declares them)")
        self.routers = routers

    @classmethod
    def for_model(cls, model: nn.Module, registry=None) -> "RoutingReplay":
        """The routers of ``model``'s MoE blocks, as its family plugin declares them."""
        from halo_core.registry import discover

        record = (registry or discover()).family_record(model.config.model_type)
        if record is None or not record.ok:
            raise RoutingReplayError(f"no family plugin claims model type {model.config.model_type!r}; routing replay finds routers through it")
        if not record.family.routing_replay:
            raise RoutingReplayError(f"family {record.name!r} declares routing_replay=False: its routers choose experts without torch.topk")
        return cls.for_family(model, record.family)

    @classmethod
    def for_family(cls, model: nn.Module, family) -> "RoutingReplay":
        """The routers of ``model``'s MoE blocks as ``family`` declares them, whatever it says of ``routing_replay``."""
        from halo_core.layout import find_moe_blocks

        return cls({f"{name}.{family.router}": getattr(block, family.router) for name, block in find_moe_blocks(model, family)})

    @contextlib.contextmanager
    def record(self) -> Iterator[Routes]:
        """Inside, every router forward records its top-k indices into the yielded ``Routes``."""
        routes: Routes = {name: [] for name in self.routers}
        with self._hooks(routes, replay=False):
            yield routes
        silent = _silent(routes)
        if silent:
            raise RoutingReplayError(f"router {silent[0]} calls no torch.topk, so routing replay cannot reach it; its family must declare "
                                     f"routing_replay=False")

    @contextlib.contextmanager
    def replay(self, routes: Routes) -> Iterator[None]:
        """Inside, every router forward chooses the recorded experts (its n-th call the n-th recorded one,
        cycling: a recomputed forward under activation checkpointing replays the same routes)."""
        missing = [name for name in self.routers if not routes.get(name)]
        if missing:
            raise RoutingReplayError(f"no recorded routes for router {missing[0]}; record them in the pass that took the log-probs")
        with self._hooks(routes, replay=True):
            yield

    @contextlib.contextmanager
    def _hooks(self, routes: Routes, replay: bool):
        handles, calls = [], {name: 0 for name in self.routers}
        for name, router in self.routers.items():
            def enter(module, args, name=name):
                recorded = None
                if replay:
                    recorded = routes[name][calls[name] % len(routes[name])]
                    calls[name] += 1
                mode = _TopK(recorded)
                mode.__enter__()
                active[name] = mode

            def leave(module, args, output, name=name):
                mode = active.pop(name)
                mode.__exit__(None, None, None)
                if not replay:
                    routes[name].append(mode.seen)

            handles.append(router.register_forward_pre_hook(enter))
            handles.append(router.register_forward_hook(leave))
        active: dict[str, _TopK] = {}
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            for mode in active.values():
                mode.__exit__(None, None, None)


def _silent(routes: Routes) -> list[str]:
    return [name for name, calls in routes.items() if calls and not any(calls)]


def silent_routers(model: nn.Module, family, **inputs) -> list[str]:
    """The routers of ``family``'s MoE blocks that ran in one forward of ``inputs`` and called no ``torch.topk``:
    those routing replay cannot reach (the kit's check of ``Family.routing_replay``, the scaffold's reading of it)."""
    replay = RoutingReplay.for_family(model, family)
    routes: Routes = {name: [] for name in replay.routers}
    with torch.no_grad(), replay._hooks(routes, replay=False):
        model(**inputs)
    return _silent(routes)


def route_rows(routes: Routes, rows: int) -> list[torch.Tensor]:
    """Recorded routes as per-row tensors, one per top-k call of a router's forward: ``[rows, tokens, routers, k]``
    (routers in ``routes``' order), so they can be shuffled and split along with the batch they were recorded on.
    The pass may have run the rows in consecutive chunks (one router forward each); a router sees its forward's
    ``rows x tokens`` flattened row-major, as the MoE blocks flatten their input."""
    names = list(routes)
    calls = len(routes[names[0]][0])
    per_call = []
    for call in range(calls):
        stacked = torch.stack([torch.cat([forward[call] for forward in routes[name]]) for name in names], dim=1)
        per_call.append(stacked.reshape(rows, -1, *stacked.shape[1:]))
    return per_call


def row_routes(per_call: list[torch.Tensor], names: list[str]) -> Routes:
    """``route_rows``' tensors (of the rows one forward runs) back as one recorded forward per router."""
    if not per_call:
        raise RoutingReplayError("the batch carries no recorded routes; record them in the pass that took the log-probs")
    return {name: [[rows[:, :, index].reshape(-1, rows.shape[-1]) for rows in per_call]] for index, name in enumerate(names)}
