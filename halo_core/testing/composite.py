"""Equivalence with image inputs: a vision-language model's text MoE under EP and its vision tower under FSDP2.

The text-only kit (``equivalence``) never runs a composite model's vision tower: its batches hold no
pixels, so a tower that FSDP2 shards wrongly, or that gets no gradient, passes unseen. Here each
data-parallel rank gets a batch of samples with one image each (the pixel inputs as the model's own
processor lays them out, see ``IMAGE_LAYOUTS``; the image's placeholder tokens between its start and end
tokens where the composite names them, samples of different lengths right-padded, labels -100 on image and
pad positions), and the parallel run is held
to one float32 process as ``equivalence`` holds text batches: loss, auxiliary loss, gradient norm, every
gradient after clipping on the first step (with its float32-resolution and float64 allowances) and every
weight after each of two SGD steps, vision tower included. It also checks what makes the comparison mean something: the vision
tower's weights are DTensors (FSDP2 sharded it), the experts are this rank's EP block and no vision weight is
one, every vision weight gets a gradient under the layout, and the steps move the vision weights the
reference's steps move.
"""

from __future__ import annotations

import copy
import inspect
from typing import Iterable

import torch
import torch.distributed as dist

from halo_core.hf_config import text_config
from halo_core.parallel.config import ParallelConfig
from halo_core.registry import discover
from halo_core.testing.compare import assert_close
from halo_core.testing.equivalence import (
    BATCH,
    LR,
    MAX_NORM,
    _check_gradient,
    _check_replicas,
    _float32_resolution,
    _float64_gradients,
    seeded_forward,
    uneven_model,
)
from halo_core.testing.spawn import spawn

#: Images the samples cycle through, in language-model tokens (frames, rows, columns): a different count per sample.
#: Each token is ``merge x merge`` patches (``merge_size``), so a Qwen-VL grid of patches is ``(t, rows * merge, columns * merge)``.
IMAGES = ((1, 1, 1), (1, 2, 1), (1, 1, 2), (1, 2, 2))

_START_KEYS = ("vision_start_token_id", "image_start_token_id", "boi_token_id")
_END_KEYS = ("vision_end_token_id", "image_end_token_id", "eoi_token_id")
_IMAGE_KEYS = ("image_token_id", "image_token_index")
_VIDEO_KEYS = ("video_token_id", "video_token_index")
#: The side, in patches, of the square of patches one language-model token is made of (Gemma 4 pools, the others merge).
_MERGE_KEYS = ("spatial_merge_size", "pooling_kernel_size")
_CHANNEL_KEYS = ("in_channels", "num_channels")


def _first(config, keys: tuple[str, ...]) -> int | None:
    return next((getattr(config, k) for k in keys if getattr(config, k, None) is not None), None)


def vision_part(config):
    """The composite config's vision sub-config (``vision_config``), or ``None`` for a text-only model."""
    return getattr(config, "vision_config", None)


def merge_size(vision) -> int:
    """Patches per side of one language-model token's square (``spatial_merge_size``, Gemma 4's ``pooling_kernel_size``)."""
    return _first(vision, _MERGE_KEYS) or 1


def _patches(vision, image, generator):
    """Qwen-VL (Qwen3-VL, Qwen3.5, GLM-4.5V): every image's patches flattened to ``channels * temporal_patch_size *
    patch_size**2`` in grid order, one ``pixel_values`` of all images; ``image_grid_thw`` counts patches."""
    t, h, w = image
    merge = merge_size(vision)
    grid = (t, h * merge, w * merge)
    width = _first(vision, _CHANNEL_KEYS) * vision.temporal_patch_size * vision.patch_size**2
    return {"pixel_values": torch.randn(grid[0] * grid[1] * grid[2], width, generator=generator), "image_grid_thw": torch.tensor(grid)}


def _merged(vision, image, generator):
    """Inkling 2: one ``(patch_size * merge)``-square of pixels, channels last, per language-model token, in raster
    order; ``image_grid_thw`` counts tokens (its processor cuts each image into such squares)."""
    side = vision.patch_size * merge_size(vision)
    tokens = image[0] * image[1] * image[2]
    return {"pixel_values": torch.randn(tokens, side, side, _first(vision, _CHANNEL_KEYS), generator=generator),
            "image_grid_thw": torch.tensor(image)}


def _positions(vision, image, generator):
    """Gemma 4: an image's patches (``3 * patch_size**2`` each, raster order) with their (column, row) position; images
    are padded to one patch count with position (-1, -1), and the tower pools ``merge x merge`` patches per token."""
    t, h, w = image
    if t != 1:
        raise ValueError(f"{type(vision).__name__} takes still images: no frames ({image})")
    merge = merge_size(vision)
    rows, columns = h * merge, w * merge
    grid = torch.meshgrid(torch.arange(columns), torch.arange(rows), indexing="xy")
    channels = _first(vision, _CHANNEL_KEYS) or 3  # Gemma 4's patch embedder is fixed to RGB
    return {"pixel_values": torch.randn(rows * columns, channels * vision.patch_size**2, generator=generator),
            "image_position_ids": torch.stack(grid, dim=-1).reshape(rows * columns, 2)}


def _cat(images: list[dict]) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.cat([i["pixel_values"] for i in images]), "image_grid_thw": torch.stack([i["image_grid_thw"] for i in images])}


def _padded(images: list[dict]) -> dict[str, torch.Tensor]:
    """Each image's patches padded to the batch's most, as Gemma 4's processor pads them (zeros, position -1)."""
    most = max(len(i["pixel_values"]) for i in images)
    pad = torch.nn.functional.pad
    return {
        "pixel_values": torch.stack([pad(i["pixel_values"], (0, 0, 0, most - len(i["pixel_values"]))) for i in images]),
        "image_position_ids": torch.stack([pad(i["image_position_ids"], (0, 0, 0, most - len(i["image_position_ids"])), value=-1) for i in images]),
    }


#: How a composite's forward takes images: one image's inputs, and a batch's from its images'.
IMAGE_LAYOUTS = {"patches": (_patches, _cat), "merged": (_merged, _cat), "positions": (_positions, _padded)}


def image_layout(model) -> str:
    """Which of ``IMAGE_LAYOUTS`` ``model`` takes, read off its forward and vision config: patch positions where the
    forward takes ``image_position_ids`` (Gemma 4); else a grid (``image_grid_thw``) of flattened patches where the
    tower groups frames into temporal patches (``temporal_patch_size``: the Qwen-VL processors' layout), of
    per-token pixel squares where it does not (Inkling 2)."""
    takes = inspect.signature(model.forward).parameters
    vision = vision_part(model.config)
    if "image_position_ids" in takes:
        return "positions"
    if "image_grid_thw" in takes:
        return "patches" if getattr(vision, "temporal_patch_size", None) else "merged"
    raise ValueError(f"{type(model).__name__}.forward takes neither image_grid_thw nor image_position_ids: image_batches does not know its image inputs")


def image_batches(model, count: int, seed: int, batch: int = BATCH) -> list[dict[str, torch.Tensor]]:
    """``count`` batches (one per data-parallel rank) of ``batch`` samples, each sample one image, the same on every process.

    Each image (``IMAGES``, in tokens) contributes its placeholder tokens; its pixels are laid out as the model's
    ``image_layout`` says. Text ids are drawn below the smallest special id and the vocabulary size, so no text
    token is taken for an image. ``mm_token_type_ids`` (1 on image tokens) is passed where the model's
    forward takes it (the M-RoPE positions of Qwen3-VL read it, Gemma 4's bidirectional image attention).
    """
    config = model.config
    vision = vision_part(config)
    if vision is None:
        raise ValueError(f"{type(model).__name__} has no vision_config: image batches need a vision-language model")
    image_id, start_id, end_id = _first(config, _IMAGE_KEYS), _first(config, _START_KEYS), _first(config, _END_KEYS)
    if image_id is None:
        raise ValueError(f"{type(config).__name__} names no image token id (tried {_IMAGE_KEYS})")
    vocab = text_config(config).vocab_size
    used = [i for i in (image_id, start_id, end_id) if i is not None]
    if max(used) >= vocab:
        raise ValueError(f"special token ids {used} are not all below the vocabulary size {vocab}: move them in the family's tiny_config")
    # text tokens stay below every special id the composite names (video start/end too), so none reads as one
    specials = [v for k, v in config.to_dict().items() if k.endswith(("_token_id", "_token_index")) and type(v) is int and v < vocab]
    text_ids = min([vocab, *specials])
    if text_ids < 2:
        raise ValueError(f"special token ids {specials} leave no ids below them for text")
    one_image, collate = IMAGE_LAYOUTS[image_layout(model)]
    takes_types = "mm_token_type_ids" in inspect.signature(model.forward).parameters

    generator = torch.Generator().manual_seed(seed + 1)
    most = max(t * h * w for t, h, w in IMAGES)
    batches, sample = [], 0
    for rank in range(count):
        rows, types, images = [], [], []
        for index in range(batch):
            image = IMAGES[sample % len(IMAGES)]
            sample += 1
            tokens = image[0] * image[1] * image[2]
            # a length of its own per sample (so all but the longest are padded) and per rank (batches of different shapes)
            before = int(torch.randint(1, 4, (1,), generator=generator))
            after = (3 + 2 + most + 1 + rank * (batch + 1) + 2 * index) - before - 2 - tokens
            ids = torch.cat([
                torch.randint(0, text_ids, (before,), generator=generator),
                torch.tensor([start_id] if start_id is not None else [], dtype=torch.long),
                torch.full((tokens,), image_id),
                torch.tensor([end_id] if end_id is not None else [], dtype=torch.long),
                torch.randint(0, text_ids, (after,), generator=generator),
            ])
            rows.append(ids)
            types.append((ids == image_id).long())
            images.append(one_image(vision, image, generator))
        length = max(len(r) for r in rows)
        input_ids = torch.zeros(batch, length, dtype=torch.long)
        attention_mask = torch.zeros(batch, length, dtype=torch.long)
        token_types = torch.zeros(batch, length, dtype=torch.long)
        for i, (row, kind) in enumerate(zip(rows, types)):  # right padding, as TRL's collators pad
            input_ids[i, : len(row)], attention_mask[i, : len(row)], token_types[i, : len(row)] = row, 1, kind
        labels = input_ids.masked_fill((token_types == 1) | (attention_mask == 0), -100)
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels, **collate(images), "use_cache": False}
        if takes_types:
            inputs["mm_token_type_ids"] = token_types
        batches.append(inputs)
    return batches


def vision_parameters(model) -> list[str]:
    """Names of the vision tower's parameters: those under the module that ``vision_config`` configures."""
    vision = vision_part(model.config)
    towers = [name for name, m in model.named_modules() if name and getattr(m, "config", None) is vision]
    tower = min(towers, key=len) if towers else None
    if tower is None:
        raise ValueError(f"no module of {type(model).__name__} holds its vision_config")
    return [n for n, _ in model.named_parameters() if n.startswith(tower + ".")]


def run_composite_layouts(family_name: str, model_type: str, world: int, layouts: Iterable[ParallelConfig], seed: int) -> None:
    """Spawn ``world`` gloo ranks and check each layout on image batches; raise ``AssertionError`` with the first rank's failure."""
    spawn(_check_layouts, world, family_name, model_type, list(layouts), seed, what=f"{family_name}/{model_type} with images (seed {seed})")


def _check_layouts(rank: int, world: int, family_name: str, model_type: str, layouts: list[ParallelConfig], seed: int) -> None:
    registry = discover(strict=False)
    record = registry.by_name(family_name)
    for config in layouts:
        check_composite_layout(registry, record, model_type, config, rank, world, seed)
        dist.barrier()


def check_composite_layout(registry, record, model_type: str, config: ParallelConfig, rank: int, world: int, seed: int, steps: int = 2) -> None:
    """One layout on one rank: this rank's image batch against the single-process reference of every rank's batch.

    ``steps`` SGD steps, each on new batches: the second forward reads the weights the first step left in
    their shards, so a step applied to a copy that forward does not read shows in its loss. Gradients are
    checked one by one on the first step (the float32-resolution and float64 allowances are computed there).
    """
    from halo_core import clip_grad_norm_, full_gradients, full_state_dict, parallelize, sync_gradients

    dims = config.resolve(world)
    if dims.cp > 1 or dims.tp > 1:
        raise ValueError(f"{config}: image batches are checked under EP and FSDP2 only (cp and tp split the text sequence and heads)")
    coords = dims.coordinates(rank)
    model = uneven_model(record, model_type, config.ep, seed)
    vision = vision_parameters(model)
    reference = copy.deepcopy(model)
    initial = {n: p.detach().clone() for n, p in reference.named_parameters() if n in vision}
    parallel = None
    for step in range(steps):
        where = f"{config} rank {rank} (images, step {step + 1})"
        batches = image_batches(reference, dims.dp, seed + 100 * step)
        first = step == 0
        truth = _float64_gradients(reference, batches, seed) if first and rank == 0 else None
        resolution = _float32_resolution(reference, batches, seed) if first and rank == 0 else {}
        reference.zero_grad()
        expected = [seeded_forward(reference, batch, r, seed) for r, batch in enumerate(batches)]
        torch.stack([out.loss for out in expected]).mean().backward()
        expected_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), MAX_NORM)
        scale = min(1.0, MAX_NORM / (expected_norm.item() + 1e-6))
        expected_grads = {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in reference.named_parameters()}
        silent = [n for n in vision if not expected_grads[n].abs().sum() > 0]
        assert not silent, f"{where}: the reference gives no gradient to vision parameters {silent[:4]}: the images do not reach the loss"
        torch.optim.SGD(reference.parameters(), lr=LR).step()

        if parallel is None:
            parallel = parallelize(model, config, registry)
            _check_split(parallel, reference, vision, dims, where)
        mine, theirs = batches[coords["dp"]], expected[coords["dp"]]
        parallel.zero_grad()
        out = seeded_forward(parallel, mine, coords["dp"], seed)
        assert_close(out.logits, theirs.logits, f"{where}: logits")
        assert_close(out.loss, theirs.loss, f"{where}: loss")
        if getattr(out, "aux_loss", None) is not None:
            assert_close(out.aux_loss, theirs.aux_loss, f"{where}: auxiliary loss")
        out.loss.backward()
        sync_gradients(parallel)
        assert_close(clip_grad_norm_(parallel, MAX_NORM), expected_norm, f"{where}: gradient norm")
        grads = full_gradients(parallel) if first else None
        torch.optim.SGD(parallel.parameters(), lr=LR).step()
        _check_replicas(parallel, where)
        state = full_state_dict(parallel)
        if rank != 0:
            continue
        if first:
            silent = [n for n in vision if not grads[n].any()]
            assert not silent, f"{where}: vision parameters {silent[:4]} got no gradient under the layout"
            for name, grad in expected_grads.items():
                _check_gradient(grads[name], grad, truth[name] * scale if truth else None, resolution.get(name, 0.0), f"{where}: gradient of {name} after clipping")
        for name, tensor in reference.state_dict().items():
            assert name in state, f"{where}: {name} missing from full_state_dict"
            assert_close(state[name], tensor, f"{where}: {name} after the step")
        # A clipped step can be below one ulp of a weight (a norm's 1.0): what moved in the reference must move here.
        moved = [n for n in vision if not torch.equal(reference.get_parameter(n).detach(), initial[n])]
        assert moved, f"{where}: the steps moved no vision parameter of the reference"
        still = [n for n in moved if torch.equal(state[n], initial[n])]
        assert not still, f"{where}: the steps left vision parameters {still[:4]} where they were (the reference moved them)"


def _check_split(model, reference, vision: list[str], dims, where: str) -> None:
    """The layout under test is the one asked for: FSDP2 shards the vision tower, EP splits the text experts."""
    from torch.distributed.tensor import DTensor

    from halo_core.parallel import dtensor
    from halo_core.parallel.layout_state import layout_of

    params = dict(model.named_parameters())
    if dims.dp > 1 and layout_of(model).fsdp:
        plain = [n for n in vision if not isinstance(params[n], DTensor)]
        assert not plain, f"{where}: FSDP2 left vision parameters {plain[:4]} as plain tensors"
    expert_params = layout_of(model).expert_params
    assert expert_params or dims.ep == 1, f"{where}: no parameter is split by EP at ep={dims.ep}"
    assert not expert_params & set(vision), f"{where}: EP split vision parameters {sorted(expert_params & set(vision))[:4]}"
    for name in expert_params:
        full = reference.get_parameter(name).shape[0]
        held = layout_of(model).expert_shard(name)
        local = dtensor.local(params[name].detach()).shape[0]
        assert local * dims.ep <= full, f"{where}: {name} holds {local} of {full} experts at ep={dims.ep} ({held})"
