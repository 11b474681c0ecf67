"""Discovery through real entry points of distributions installed on a temporary sys.path."""

import pytest

from halo_core.errors import BrokenPluginError, DuplicateClaimError, UnknownFamilyError
from halo_core.registry import discover


def by_name(registry):
    return {r.name: r for r in registry.records}


def test_bundled_families_are_found_through_their_entry_points():
    records = by_name(discover(strict=False))
    assert records["qwen3-moe"].ok and records["qwen3-moe"].distribution == "halo-plugin-qwen3-moe"
    assert records["gpt-oss"].ok and records["gpt-oss"].family.model_types == ("gpt_oss",)


def test_a_newly_installed_distribution_is_discovered(plugin_site):
    plugin_site.add_family("halo-plugin-toy", "toy", ("toy_moe",))
    registry = discover(strict=False)
    record = registry.family_record("toy_moe")
    assert record.ok and record.name == "toy" and record.distribution == "halo-plugin-toy"
    assert registry.supported_splits(record, "toy_moe") == {"ep"}


def test_unclaimed_model_type_resolves_to_the_plain_route():
    assert discover(strict=False).family_record("llama") is None


@pytest.mark.parametrize(
    "source, reason",
    [
        ("raise ImportError('needs a missing library')\n", "import failed: ImportError: needs a missing library"),
        ("from halo_core import hookimpl\n@hookimpl\ndef halo_family():\n    raise RuntimeError('boom')\n", "halo_family() failed: RuntimeError: boom"),
        ("from halo_core import hookimpl\n@hookimpl\ndef halo_family():\n    return {'name': 'x'}\n", "returned dict"),
        ("from halo_core import hookimpl\n@hookimpl\ndef wrap_moe_block(module, context, bogus):\n    pass\n", "invalid hook implementation"),
    ],
)
def test_a_broken_plugin_is_listed_with_its_reason_and_others_keep_working(plugin_site, source, reason):
    plugin_site.add("halo-plugin-broken", source, entry="broken")
    registry = discover(strict=False)
    broken = by_name(registry)["broken"]
    assert not broken.ok and reason in broken.as_json()["error"]
    assert broken.as_json()["status"] == "broken"
    assert registry.family_record("qwen3_moe").ok
    with pytest.raises(BrokenPluginError, match="broken"):
        discover(strict=True)


def test_an_incompatible_plugin_api_is_broken(plugin_site):
    plugin_site.add_family("halo-plugin-future", "future", ("toy_moe",), api_version=99)
    registry = discover(strict=False)
    error = by_name(registry)["future"].as_json()["error"]
    assert "plugin API 99" in error and "speaks 1" in error
    assert registry.family_record("toy_moe") is None


def test_strict_mode_from_the_environment(plugin_site, monkeypatch):
    plugin_site.add("halo-plugin-broken", "raise ImportError('x')\n", entry="broken")
    monkeypatch.setenv("HALO_STRICT_PLUGINS", "1")
    with pytest.raises(BrokenPluginError):
        discover()


def test_duplicate_claims_name_both_distributions_and_never_resolve(plugin_site):
    plugin_site.add_family("halo-plugin-first", "first", ("toy_moe_b", "toy_moe"))
    plugin_site.add_family("halo-plugin-second", "second", ("toy_moe_b",))
    registry = discover(strict=False)
    with pytest.raises(DuplicateClaimError) as info:
        registry.family_record("toy_moe_b")
    assert "halo-plugin-first" in str(info.value) and "halo-plugin-second" in str(info.value) and "'toy_moe_b'" in str(info.value)
    records = by_name(registry)
    assert "also claimed by halo-plugin-second" in records["first"].as_json()["error"]
    assert "also claimed by halo-plugin-first" in records["second"].as_json()["error"]
    assert registry.family_record("qwen3_moe").ok


def test_disabled_plugins_are_skipped(plugin_site, monkeypatch):
    plugin_site.add_family("halo-plugin-first", "first", ("toy_moe_b",))
    plugin_site.add_family("halo-plugin-second", "second", ("toy_moe_b",))
    monkeypatch.setenv("HALO_DISABLE_PLUGINS", "second, gpt-oss")
    registry = discover(strict=False)
    names = set(by_name(registry))
    assert "first" in names and "qwen3-moe" in names and not names & {"second", "gpt-oss"}
    assert registry.family_record("toy_moe_b").name == "first"


def test_unknown_family_name_lists_the_known_ones():
    with pytest.raises(UnknownFamilyError, match="known families: .*gpt-oss.*qwen3-moe"):
        discover(strict=False).by_name("nope")


def test_hooks_dispatch_only_to_the_plugin_claiming_the_model_type(plugin_site):
    answer = """
    @hookimpl
    def wrap_moe_block(module, context):
        return "answered by {}"
    """
    plugin_site.add_family("halo-plugin-a", "a", ("toy_moe_b",), extra=answer.format("a"))
    plugin_site.add_family("halo-plugin-b", "b", ("toy_moe",), extra=answer.format("b"))
    registry = discover(strict=False)
    for model_type, expected in (("toy_moe_b", "answered by a"), ("toy_moe", "answered by b")):
        record = registry.family_record(model_type)
        assert registry.hooks(record).wrap_moe_block(module=None, context=None) == expected
        assert registry.overridden_hooks(record) == ["halo_family", "wrap_moe_block"]
    # qwen3-moe implements no layout hook: only the core's default answers for it.
    qwen = registry.family_record("qwen3_moe")
    assert registry.overridden_hooks(qwen) == ["halo_family"]
