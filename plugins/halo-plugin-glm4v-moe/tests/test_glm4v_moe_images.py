"""GLM-4.5V's text MoE under EP and its vision tower under FSDP2 match one process on image batches (issue 28)."""

import pytest

from halo_core.parallel.config import ParallelConfig
from halo_core.testing.composite import run_composite_layouts


@pytest.mark.parametrize("world", [2, 4], ids=["ep2-world2", "ep2-dp2-world4"])
def test_glm4v_moe_matches_one_process_on_image_batches(world):
    run_composite_layouts("glm4v-moe", "glm4v_moe", world, [ParallelConfig(ep=2)], seed=0)
