"""GLM-4.5V's text MoE under EP and its vision tower under FSDP2 match one process on image batches (issue 28)."""

from halo_core.parallel.config import ParallelConfig
from halo_core.testing.composite import run_composite_layouts


def test_glm4v_moe_matches_one_process_on_image_batches():
    """World 4 only (ep=2 with two FSDP2 replicas of each expert block): the pure ep=2 case at world 2 is run
    for qwen3-vl-moe in tests/test_composite_vlm.py, and the suite has a time budget."""
    run_composite_layouts("glm4v-moe", "glm4v_moe", 4, [ParallelConfig(ep=2)], seed=0)
