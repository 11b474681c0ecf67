from halo_core.testing import check_family


def test_halo_plugin_glm4v_moe_passes_the_conformance_kit():
    check_family('glm4v-moe')
