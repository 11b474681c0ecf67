from halo_core.testing import check_family


def test_halo_plugin_deepseek_v3_passes_the_conformance_kit():
    check_family('deepseek-v3')
