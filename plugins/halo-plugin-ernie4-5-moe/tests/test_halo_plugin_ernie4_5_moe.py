from halo_core.testing import check_family


def test_halo_plugin_ernie4_5_moe_passes_the_conformance_kit():
    check_family('ernie4-5-moe')
