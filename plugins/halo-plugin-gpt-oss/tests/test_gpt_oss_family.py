from halo_core.testing import check_family


def test_gpt_oss_passes_the_conformance_kit():
    check_family("gpt-oss")
