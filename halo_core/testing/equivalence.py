"""Multi-process equivalence: a parallel layout must reproduce a single process, step for step.

Every spawned rank (gloo, real collectives) builds the same tiny model, makes routing
uneven (one MoE block never routes to the last EP rank's experts, so that rank receives
no tokens there), and computes the single-process reference itself: forward on every
rank's batch, the mean of those losses, backward, clipping, one SGD step. Then it lays
the model out, runs its own batch and compares logits, loss, auxiliary loss, gradient
norm, and (rank 0) every gradient after clipping and every parameter after the step,
each within 1e-5 relative. A gradient whose terms cancel (a norm's scale summed over all
tokens, a linear-attention gate's bias) can be further than that from the truth in float32
whatever the order of summation. Two allowances, each measured, never assumed: the parallel
gradient may differ from the single-process one by 4 times what float32 itself resolves of
it (how far it moves when every weight moves by one unit in the last place, the worse of two
such moves), or be no more than 4 times as far from the float64 gradient as the
single-process float32 one is. After the step the ranks meant to
hold the same copy of a parameter must hold the same values, so a copy that one rank
alone updated wrongly cannot hide behind rank 0's state dict.
Every forward of data-parallel batch ``r`` starts from the same random state, on one process and
on the rank that runs it, so a router that samples its experts in training (PhiMoE's sparsemixer)
draws the same samples in both; a layout that splits a sequence (CP) draws other ones.
"""

from __future__ import annotations

import copy
from typing import Iterable

import torch
import torch.distributed as dist

from halo_core.hf_config import text_config
from halo_core.layout import find_moe_blocks
from halo_core.parallel import dtensor
from halo_core.parallel.config import ParallelConfig
from halo_core.parallel.expert_parallel import count_experts
from halo_core.registry import discover
from halo_core.testing.compare import RTOL, assert_close, relative_error
from halo_core.testing.routing import starve_experts
from halo_core.testing.spawn import spawn
from halo_core.tiny import config_top_k, tiny_config, tiny_model, top_k_key, top_k_override

#: Three of eight experts per token, so top-k exceeds the two experts each rank holds at ep=4.
KIT_TOP_K = 3
BATCH = 2
MAX_NORM = 1e-2
LR = 1.0
#: The most the float32-resolution allowance may reach: a one-ulp move that flips a router's choice
#: moves every gradient, and must not make the check lenient for real mistakes.
RESOLUTION_CAP = 10 * RTOL


def run_layouts(family_name: str, model_type: str, world: int, layouts: Iterable[ParallelConfig], seed: int, *, packed: bool = False) -> None:
    """Spawn ``world`` ranks and check each layout; raise ``AssertionError`` with the first rank's failure.

    ``packed``: each data-parallel rank's batch is one row of several documents (position ids
    restarting at 0, the first token of each unlabelled, as TRL's padding-free collator does).
    """
    what = f"{family_name}/{model_type}{' packed' if packed else ''} (seed {seed})"
    spawn(_check_layouts, world, family_name, model_type, list(layouts), seed, packed, what=what)


def _check_layouts(rank: int, world: int, family_name: str, model_type: str, layouts: list[ParallelConfig], seed: int, packed: bool = False) -> None:
    registry = discover(strict=False)
    record = registry.by_name(family_name)
    for config in layouts:
        _check_layout(registry, record, model_type, config, rank, world, seed, packed)
        dist.barrier()


def uneven_model(record, model_type: str, ep: int, seed: int, aux_loss: bool = True, head_split: int = 1):
    """The kit's tiny model: the first MoE block never routes to the last EP rank's experts.

    ``head_split`` (tp x cp) must divide the key/value heads: where the tiny config's do
    not, it gets as many key/value heads as query heads.
    """
    family = record.family
    kit_top_k = top_k_override(model_type, KIT_TOP_K)
    kit = {"output_router_logits": aux_loss, **kit_top_k}
    if head_split > 1:
        text = text_config(tiny_config(model_type, dict(family.tiny_config)))
        if getattr(text, "num_key_value_heads", None) and text.num_key_value_heads % head_split:
            kit["num_key_value_heads"] = text.num_attention_heads
    try:
        model = tiny_model(model_type, {**kit, **family.tiny_config}, model_class=family.class_for(model_type), seed=seed)  # the family's needs win
    except Exception as exc:  # a config that refuses the kit's top-k (Zaya takes one expert per token only): its own
        key = top_k_key(model_type)
        if key is None or key not in str(exc):
            raise
        model = tiny_model(model_type, {**{k: v for k, v in kit.items() if k not in kit_top_k}, **family.tiny_config}, model_class=family.class_for(model_type), seed=seed)
    model.train()
    top_k = config_top_k(model.config)
    _, block = find_moe_blocks(model, family)[0]
    num_experts = count_experts(getattr(block, family.experts))
    starved = min(num_experts // ep, num_experts - 2 * top_k)
    starve_experts(getattr(block, family.router), num_experts, list(range(num_experts - starved, num_experts)), top_k)
    return model


def rank_batches(world: int, vocab_size: int, seed: int, multiple: int = 1, packed: bool = False) -> list[dict[str, torch.Tensor]]:
    """One batch per data-parallel rank, of different sequence lengths (multiples of ``multiple``), the same on every process."""
    generator = torch.Generator().manual_seed(seed + 1)
    batches = []
    for rank in range(world):
        if packed:  # one row of three documents of random lengths
            lengths = (torch.randint(2, 9, (3,), generator=generator)).tolist()
            lengths[-1] += -sum(lengths) % multiple
            ids = torch.randint(0, vocab_size, (1, sum(lengths)), generator=generator)
            positions = torch.cat([torch.arange(n) for n in lengths])[None]
            labels = ids.masked_fill(positions == 0, -100)
            # use_cache=False as TRL passes it: with a cache transformers does not read documents off position ids
            batches.append({"input_ids": ids, "labels": labels, "position_ids": positions, "use_cache": False})
            continue
        length = -(-(5 + 2 * rank) // multiple) * multiple
        ids = torch.randint(0, vocab_size, (BATCH, length), generator=generator)
        batches.append({"input_ids": ids, "labels": ids.clone()})
    return batches


def seeded_forward(model, batch: dict, dp_rank: int, seed: int):
    """``model(**batch)`` from the random state of data-parallel batch ``dp_rank`` (see the module docstring)."""
    torch.manual_seed(seed + 7919 * (dp_rank + 1))
    return model(**batch)


def _gradients(model, batches, seed: int) -> dict[str, torch.Tensor]:
    model.zero_grad()
    torch.stack([seeded_forward(model, batch, r, seed).loss for r, batch in enumerate(batches)]).mean().backward()
    return {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in model.named_parameters()}


def _float32_resolution(model, batches, seed: int, moves: int = 2) -> dict[str, float]:
    """Per parameter, how far its single-process float32 gradient moves (relative) when every weight
    moves by one unit in the last place in a random direction: the worse of ``moves`` such moves.
    A sum whose terms cancel moves far, and no order of summation pins it down better than that."""
    base = _gradients(copy.deepcopy(model), batches, seed)
    worst = dict.fromkeys(base, 0.0)
    for move in range(moves):
        generator = torch.Generator().manual_seed(move)
        moved = copy.deepcopy(model)
        with torch.no_grad():
            for p in moved.parameters():
                up = torch.rand(p.shape, generator=generator) < 0.5
                p.copy_(torch.nextafter(p, torch.where(up, torch.inf, -torch.inf).to(p.dtype)))
        for name, grad in _gradients(moved, batches, seed).items():
            if base[name].abs().sum() > 0:
                worst[name] = max(worst[name], relative_error(grad, base[name]))
    return worst


def _float64_gradients(model, batches, seed: int) -> dict[str, torch.Tensor] | None:
    """The reference gradients computed in float64 (the truth both float32 runs approximate).

    ``None`` where the model cannot run in float64 (a module that casts to float32 itself,
    as Inkling's router does); gradients are then held to 1e-5 of single-process float32 plainly.
    """
    exact = copy.deepcopy(model).double()
    exact.set_experts_implementation("eager")  # grouped_mm has no float64 kernel on the CPU
    try:
        torch.stack([seeded_forward(exact, batch, r, seed).loss for r, batch in enumerate(batches)]).mean().backward()
    except RuntimeError:
        return None
    return {n: (p.grad if p.grad is not None else torch.zeros_like(p)).float() for n, p in exact.named_parameters()}


def _check_gradient(actual: torch.Tensor, expected: torch.Tensor, truth: torch.Tensor | None, resolution: float, what: str) -> None:
    """Within 1e-5 of the single-process float32 gradient, or within 4 times its float32 ``resolution``
    up to ``RESOLUTION_CAP`` (seen: a linear-attention ``dt_bias`` 1.7e-5 from one process, whose
    gradient moved 2.2e-5 and 4.0e-5 under two one-ulp moves of the weights). Else, where the
    single-process gradient is itself farther than a quarter of 1e-5 from the float64 truth, no more
    than 4 times as far from the truth as it is: two float32 results each about 5e-6 off the truth,
    on opposite sides, differ by 1e-5."""
    error = relative_error(actual, expected)
    if error <= max(RTOL, min(4 * resolution, RESOLUTION_CAP)):
        return
    if truth is None:
        assert_close(actual, expected, what)  # raises: no float64 reference to weigh the difference against
        return
    theirs = relative_error(expected, truth)
    ours = relative_error(actual, truth)
    if theirs > RTOL / 4 and ours <= 4 * theirs:
        return
    raise AssertionError(
        f"{what}: relative error {error:.3e} against one process "
        f"({ours:.3e} against float64, where one process in float32 is at {theirs:.3e}; "
        f"float32 resolves this gradient to {resolution:.3e})"
    )


def _check_step(actual: torch.Tensor, expected: torch.Tensor, before: torch.Tensor | None, grad: torch.Tensor | None, what: str) -> None:
    """Within 1e-5 of the single-process weight after the step; else exactly this layout's own SGD step from the
    same weight: the difference is then its gradient's, which ``_check_gradient`` has held to float32's resolution
    (a weight near zero that moves by about itself, as DeepSeek-V4's hyper-connection ``base``, shows it relatively
    larger)."""
    if relative_error(actual, expected) <= RTOL or before is None or grad is None:
        assert_close(actual, expected, what)
        return
    assert_close(actual, before - LR * grad, f"{what}, against this layout's own SGD step")


def _check_replicas(model, where: str) -> None:
    """Ranks meant to hold the same copy of a parameter (TP-replicated, ETP-whole, without FSDP every
    replica) hold the same values after the step: rank 0's state dict cannot speak for the others."""
    from halo_core.parallel.grads import replicated_dims
    from halo_core.parallel.layout_state import layout_of
    from halo_core.parallel.mesh import flat_group

    mesh = layout_of(model).mesh
    params = dict(model.named_parameters())
    for name, dims in replicated_dims(model).items():
        dims = tuple(d for d in dims if mesh[d].size() > 1)
        if not dims:
            continue
        local = dtensor.local(params[name].detach())
        group = flat_group(mesh, dims)
        copies = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(copies, local.contiguous(), group=group)
        for index, copy_ in enumerate(copies):
            # the same arithmetic on the same inputs: copies agree to the last bit (1e-7 leaves room for none else)
            assert_close(copy_, local, f"{where}: {name} differs from its copy on rank {index} of its {'x'.join(dims)} group after one step", rtol=1e-7)


def _check_layout(registry, record, model_type, config: ParallelConfig, rank: int, world: int, seed: int, packed: bool = False) -> None:
    from halo_core import clip_grad_norm_, full_gradients, full_state_dict, parallelize, sync_gradients

    from halo_core.parallel.context_parallel import context_parallel_inputs
    from halo_core.parallel.layout_state import layout_of

    where = f"{config} rank {rank}"
    dims = config.resolve(world)
    coords = dims.coordinates(rank)
    # The auxiliary loss is a nonlinear function of the tokens it sees: a sequence's chunks do not add up to it.
    model = uneven_model(record, model_type, config.ep, seed, aux_loss=dims.cp == 1, head_split=dims.tp * (dims.cp if config.cp_attention == "ulysses" else 1))
    reference = copy.deepcopy(model)
    batches = rank_batches(dims.dp, text_config(model.config).vocab_size, seed, multiple=dims.cp, packed=packed)  # a composite keeps it on its text part

    truth = _float64_gradients(model, batches, seed) if rank == 0 else None
    resolution = _float32_resolution(model, batches, seed) if rank == 0 else {}
    expected = [seeded_forward(reference, batch, r, seed) for r, batch in enumerate(batches)]
    torch.stack([out.loss for out in expected]).mean().backward()
    expected_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), MAX_NORM)
    scale = min(1.0, MAX_NORM / (expected_norm.item() + 1e-6))
    expected_grads = {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in reference.named_parameters()}
    torch.optim.SGD(reference.parameters(), lr=LR).step()

    before = {n: p.detach().clone() for n, p in model.named_parameters()} if rank == 0 else {}
    model = parallelize(model, config, registry)
    mine, theirs = batches[coords["dp"]], expected[coords["dp"]]
    # CP: this rank's chunk of its data-parallel sample; the CP group's losses add up to the sample's
    split = dict(labels=mine["labels"], position_ids=mine.get("position_ids"))
    inputs = {**context_parallel_inputs(mine["input_ids"], coords["cp"], dims.cp, **split), "use_cache": False} if dims.cp > 1 else mine
    chunk = slice(coords["cp"] * inputs["input_ids"].shape[1], (coords["cp"] + 1) * inputs["input_ids"].shape[1])
    out = seeded_forward(model, inputs, coords["dp"], seed)
    assert_close(out.logits, theirs.logits[:, chunk], f"{where}: logits of sequence chunk {coords['cp']} of {dims.cp}")
    if dims.cp == 1:
        assert_close(out.loss, theirs.loss, f"{where}: loss")
    else:
        total = out.loss.detach().clone()
        dist.all_reduce(total, group=layout_of(model).group("cp"))
        assert_close(total, theirs.loss, f"{where}: loss summed over the CP group")
    if getattr(out, "aux_loss", None) is not None:
        assert_close(out.aux_loss, theirs.aux_loss, f"{where}: auxiliary loss")
    out.loss.backward()
    sync_gradients(model)
    assert_close(clip_grad_norm_(model, MAX_NORM), expected_norm, f"{where}: gradient norm")
    grads = full_gradients(model)
    torch.optim.SGD(model.parameters(), lr=LR).step()
    _check_replicas(model, where)
    state = full_state_dict(model)
    if rank == 0:
        for name, grad in expected_grads.items():
            _check_gradient(grads[name], grad, truth[name] * scale if truth else None, resolution.get(name, 0.0), f"{where}: gradient of {name} after clipping")
        for name, tensor in reference.state_dict().items():
            assert name in state, f"{where}: {name} missing from full_state_dict"
            _check_step(state[name], tensor, before.get(name), grads.get(name), f"{where}: {name} after one step")
