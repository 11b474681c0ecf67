"""A vision-language MoE (Qwen3-VL-MoE) trains with its text MoE under EP and its vision tower under FSDP2,
on image batches, as one float32 process does (issue 28)."""

import pytest
import torch

from halo_core.parallel.config import ParallelConfig
from halo_core.registry import discover
from halo_core.testing.composite import image_batches, run_composite_layouts, vision_parameters
from halo_core.tiny import tiny_family_model

FAMILY, MODEL_TYPE = "qwen3-vl-moe", "qwen3_vl_moe"


@pytest.fixture(scope="module")
def model():
    record = discover(strict=False).by_name(FAMILY)
    return tiny_family_model(record.family, MODEL_TYPE).train()


def test_image_batches_hold_one_image_per_sample_between_its_vision_tokens(model):
    config, merge = model.config, model.config.vision_config.spatial_merge_size
    batches = image_batches(model, 2, seed=0)
    assert batches[0]["input_ids"].shape != batches[1]["input_ids"].shape  # the ranks' batches differ in length
    for batch in batches:
        ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
        grids = batch["image_grid_thw"]
        assert batch["pixel_values"].shape[0] == int(grids.prod(-1).sum())
        assert (mask.sum(-1) < ids.shape[1]).any()  # samples of different lengths: one is padded
        for row, grid in enumerate(grids):
            image = (ids[row] == config.image_token_id).nonzero().flatten()
            assert len(image) == int(grid.prod()) // merge**2
            assert ids[row, image[0] - 1] == config.vision_start_token_id and ids[row, image[-1] + 1] == config.vision_end_token_id
            assert torch.equal(batch["mm_token_type_ids"][row], (ids[row] == config.image_token_id).long())
        ignored = (ids == config.image_token_id) | (mask == 0)
        assert (labels[ignored] == -100).all() and (labels[~ignored] == ids[~ignored]).all()


def test_the_images_reach_the_loss_and_the_vision_tower_gets_gradients(model):
    """Would fail if the image batches' pixels were ignored (no placeholder tokens, a tower never called)."""
    batch = image_batches(model, 1, seed=0)[0]
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    assert not torch.equal(model(**{**batch, "pixel_values": torch.zeros_like(batch["pixel_values"])}).loss, loss)
    assert not torch.equal(model(**{**batch, "pixel_values": batch["pixel_values"].flip(0)}).loss, loss)
    silent = [n for n in vision_parameters(model) if model.get_parameter(n).grad is None or not model.get_parameter(n).grad.any()]
    assert not silent


@pytest.mark.parametrize(
    "world, layouts",
    [(2, [ParallelConfig(ep=2)]), (4, [ParallelConfig(ep=2)])],
    ids=["ep2-world2", "ep2-dp2-world4"],
)
def test_vision_language_moe_matches_one_process_on_image_batches(world, layouts):
    """ep=2 at world 2: each rank holds its experts alone; at world 4 each expert block has two FSDP2 replicas.
    Two SGD steps; losses, gradients and weights (vision tower included) against one float32 process."""
    run_composite_layouts(FAMILY, MODEL_TYPE, world, layouts, seed=0)
