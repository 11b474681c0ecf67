from halo_core.testing import check_family


def test_halo_plugin_ergo_passes_the_conformance_kit():
    check_family('ergo')
