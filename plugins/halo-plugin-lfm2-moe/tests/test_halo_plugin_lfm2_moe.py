from halo_core.testing import check_family


def test_halo_plugin_lfm2_moe_passes_the_conformance_kit():
    check_family('lfm2-moe')
