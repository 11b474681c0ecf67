"""Discovery through real entry points of distributions installed on a temporary sys.path."""

import warnings

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


def test_a_misspelt_hook_breaks_its_plugin_naming_the_hook(plugin_site):
    """Without pluggy's check_pending the misspelt hook registers silently and the core's default runs in its place."""
    plugin_site.add_family("halo-plugin-typo", "typo", ("toy_moe",), extra="""
        @hookimpl
        def wrap_moe_blok(module, context):
            return module
    """)
    registry = discover(strict=False)
    error = by_name(registry)["typo"].as_json()["error"]
    assert "unknown hook 'wrap_moe_blok'" in error and "not a Halo hook" in error
    assert registry.family_record("qwen3_moe").ok
    with pytest.raises(BrokenPluginError, match="toy_moe.*halo-plugin-typo.*wrap_moe_blok"):
        registry.family_record("toy_moe")
    with pytest.raises(BrokenPluginError, match="wrap_moe_blok"):
        discover(strict=True)


@pytest.mark.parametrize("declared, outcome", [
    ("1.2", "ok"), ("1.1", "deprecated"), (1, "deprecated"), ("1.3", "broken"), (2, "broken"), ("0.9", "broken"),
])
def test_the_plugin_api_is_a_compatible_range(plugin_site, monkeypatch, declared, outcome):
    """Same major and a minor up to the core's loads, an older minor with a FutureWarning; a newer minor or another
    major is broken, naming the range."""
    monkeypatch.setattr("halo_core.registry.PLUGIN_API_VERSION", "1.2")
    plugin_site.add_family("halo-plugin-ranged", "ranged", ("toy_moe",), api_version=declared)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record = by_name(discover(strict=False))["ranged"]
    deprecations = [str(w.message) for w in caught if issubclass(w.category, FutureWarning) and "ranged" in str(w.message)]
    if outcome == "broken":
        assert not record.ok and "speaks 1.2 (it loads plugins of API 1.0 to 1.2)" in record.as_json()["error"]
    else:
        assert record.ok and record.family.api_version == declared
        assert bool(deprecations) == (outcome == "deprecated"), deprecations
        assert not deprecations or f"written for plugin API {declared}; this halo-core speaks 1.2" in deprecations[0]


def test_discovery_and_methods_load_once_per_process(plugin_site):
    """A launch asks the registry from about eight places; each used to build a plugin manager and import every plugin."""
    from halo_core.registry import reset_caches
    from halo_core.trainers.method import get_method

    first = discover()
    assert discover() is first and get_method("sft") is get_method("sft")
    plugin_site.add_family("halo-plugin-late", "late", ("toy_moe",))  # installing resets, as reset_caches() does
    assert discover() is not first and by_name(discover())["late"].ok
    again = discover()
    reset_caches()
    assert discover() is not again
