"""Vision-language MoEs (Qwen3-VL-MoE, GLM-4.5V, Gemma 4, Inkling 2, Qwen3.5-MoE) train with their text MoE under EP
and their vision tower under FSDP2, on image batches, as one float32 process does (issue 28)."""

import inspect

import pytest
import torch

from halo_core.parallel.config import ParallelConfig
from halo_core.registry import discover
from halo_core.testing.composite import _END_KEYS, _START_KEYS, _first, image_batches, image_layout, run_composite_layouts, vision_parameters
from halo_core.tiny import tiny_family_model

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

FAMILY, MODEL_TYPE = "qwen3-vl-moe", "qwen3_vl_moe"
#: Each composite the image batches are held on; the first also at world 2. Between them the three image layouts
#: (Qwen-VL's flattened patches, Inkling 2's per-token squares, Gemma 4's patches with positions).
COMPOSITES = [(FAMILY, MODEL_TYPE), ("glm4v-moe", "glm4v_moe"), ("gemma4", "gemma4"), ("inkling2", "inkling2"),
              ("qwen3-5-moe", "qwen3_5_moe")]


@pytest.fixture(scope="module", params=COMPOSITES, ids=[t for _, t in COMPOSITES])
def model(request):
    family, model_type = request.param
    record = discover(strict=False).by_name(family)
    return tiny_family_model(record.family, model_type).train()


def test_each_composite_is_built_whole_as_its_conditional_generation_class(model):
    """The family builds the composite class (not a text-only causal LM that would drop the tower)."""
    assert type(model).__name__.endswith("ForConditionalGeneration") and vision_parameters(model)


def test_the_image_layouts_are_told_apart():
    layouts = {}
    for family, model_type in COMPOSITES:
        record = discover(strict=False).by_name(family)
        layouts[model_type] = image_layout(tiny_family_model(record.family, model_type, device="meta"))
    assert layouts == {"qwen3_vl_moe": "patches", "glm4v_moe": "patches", "qwen3_5_moe": "patches", "inkling2": "merged", "gemma4": "positions"}


def test_image_batches_hold_one_image_per_sample_between_its_vision_tokens(model):
    """Each row holds as many placeholder tokens as the model's own ``get_image_features`` makes of its image."""
    config = model.config
    batches = image_batches(model, 2, seed=0)
    assert batches[0]["input_ids"].shape != batches[1]["input_ids"].shape  # the ranks' batches differ in length
    takes = inspect.signature(model.get_image_features).parameters
    for batch in batches:
        ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
        with torch.no_grad():
            features = model.get_image_features(**{k: v for k, v in batch.items() if k in takes}).pooler_output
        assert len(features) == len(ids)
        assert len({len(f) for f in features}) > 1  # images of different token counts
        assert (mask.sum(-1) < ids.shape[1]).any()  # samples of different lengths: one is padded
        for row, feature in enumerate(features):
            image = (ids[row] == config.image_token_id).nonzero().flatten()
            assert len(image) == len(feature) and int(image[-1] - image[0]) + 1 == len(image)
            start, end = _first(config, _START_KEYS), _first(config, _END_KEYS)  # vision_* (Qwen), image_* (GLM), boi/eoi (Gemma 4)
            if start is not None:
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
     ("glm4v-moe", "glm4v_moe", 4, [ParallelConfig(ep=2)]), ("gemma4", "gemma4", 4, [ParallelConfig(ep=2)]),
     ("inkling2", "inkling2", 4, [ParallelConfig(ep=2)]), ("qwen3-5-moe", "qwen3_5_moe", 4, [ParallelConfig(ep=2)])],
    ids=["qwen3_vl_moe-ep2-world2", "qwen3_vl_moe-ep2-dp2-world4", "glm4v_moe-ep2-dp2-world4", "gemma4-ep2-dp2-world4",
         "inkling2-ep2-dp2-world4", "qwen3_5_moe-ep2-dp2-world4"],
)
def test_vision_language_moe_matches_one_process_on_image_batches(family, model_type, world, layouts):
    """ep=2 at world 2: each rank holds its experts alone; at world 4 each expert block has two FSDP2 replicas.
    Two SGD steps; losses, gradients and weights (vision tower included) against one float32 process."""
    run_composite_layouts(family, model_type, world, layouts, seed=0)
