from halo_core.testing import check_family


def test_qwen3_moe_passes_the_conformance_kit():
    check_family("qwen3-moe")
