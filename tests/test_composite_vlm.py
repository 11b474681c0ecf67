"""Vision-language MoEs (Qwen3-VL-MoE, GLM-4.5V) train with their text MoE under EP and their vision tower under
FSDP2, on image batches, as one float32 process does (issue 28)."""

import pytest
import torch

from halo_core.parallel.config import ParallelConfig
from halo_core.registry import discover
from halo_core.testing.composite import _END_KEYS, _START_KEYS, _first, image_batches, run_composite_layouts, vision_parameters
from halo_core.tiny import tiny_family_model

FAMILY, MODEL_TYPE = "qwen3-vl-moe", "qwen3_vl_moe"
#: Each composite the image batches are held on; the first also at world 2 and in the batch-shape checks.
COMPOSITES = [(FAMILY, MODEL_TYPE), ("glm4v-moe", "glm4v_moe")]


@pytest.fixture(scope="module", params=COMPOSITES, ids=[t for _, t in COMPOSITES])
def model(request):
    family, model_type = request.param
    record = discover(strict=False).by_name(family)
    return tiny_family_model(record.family, model_type).train()


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
            start, end = _first(config, _START_KEYS), _first(config, _END_KEYS)  # vision_* (Qwen), image_* (GLM)
            assert ids[row, image[0] - 1] == start and ids[row, image[-1] + 1] == end
            if "mm_token_type_ids" in batch:  # where the forward takes it (Qwen3-VL's M-RoPE positions)
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
    "family, model_type, world, layouts",
    [(FAMILY, MODEL_TYPE, 2, [ParallelConfig(ep=2)]), (FAMILY, MODEL_TYPE, 4, [ParallelConfig(ep=2)]),
     ("glm4v-moe", "glm4v_moe", 4, [ParallelConfig(ep=2)])],
    ids=["qwen3_vl_moe-ep2-world2", "qwen3_vl_moe-ep2-dp2-world4", "glm4v_moe-ep2-dp2-world4"],
)
def test_vision_language_moe_matches_one_process_on_image_batches(family, model_type, world, layouts):
    """ep=2 at world 2: each rank holds its experts alone; at world 4 each expert block has two FSDP2 replicas.
    Two SGD steps; losses, gradients and weights (vision tower included) against one float32 process."""
    run_composite_layouts(family, model_type, world, layouts, seed=0)
