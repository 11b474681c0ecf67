from halo_core.testing import check_family


def test_halo_plugin_hunyuan_v1_moe_passes_the_conformance_kit():
    check_family('hunyuan-v1-moe')
