from halo_core.testing import check_family


def test_halo_plugin_qwen3_vl_moe_passes_the_conformance_kit():
    check_family('qwen3-vl-moe')
