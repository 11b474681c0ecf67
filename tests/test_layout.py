"""Matching family declarations against real transformers module trees, and reading them off one."""

import pytest
import torch

from halo_core import Family
from halo_core.adapt import adapt_model
from halo_core.context import ParallelContext
from halo_core.errors import LayoutError
from halo_core.layout import find_attention, find_moe_blocks, infer_layout, matches
from halo_core.registry import discover
from halo_core.tiny import tiny_model


def family(**kw):
    return Family(name="t", model_types=("qwen3_moe",), version="0", api_version=1, **kw)


def test_star_is_exactly_one_path_segment():
    assert matches("model.layers.3.mlp", ("model.layers.*.mlp",))
    assert not matches("model.layers.3.block.mlp", ("model.layers.*.mlp",))
    assert not matches("model.layers.3.mlp.experts", ("model.layers.*.mlp",))
    assert matches("model.layers.3.feed_forward", ("model.layers.*.mlp", "model.layers.*.feed_forward"))


def test_dense_layers_at_a_moe_path_are_not_moe_blocks():
    model = tiny_model("qwen3_moe", {"num_hidden_layers": 3, "mlp_only_layers": [1]}, device="meta")
    names = [n for n, _ in find_moe_blocks(model, family())]
    assert names == ["model.layers.0.mlp", "model.layers.2.mlp"]
    assert len(find_attention(model, family())) == 3


def test_a_wrong_router_name_finds_no_blocks():
    model = tiny_model("qwen3_moe", device="meta")
    assert find_moe_blocks(model, family(router="router")) == []


@pytest.mark.parametrize(
    "model_type, overrides, router",
    [("qwen3_moe", {}, "gate"), ("gpt_oss", {"attn_implementation": "eager"}, "router"), ("mixtral", {}, "gate")],
)
def test_infer_layout_reads_the_declaration_off_a_model(model_type, overrides, router):
    layout = infer_layout(tiny_model(model_type, overrides, device="meta"))
    assert layout == {"moe_block": ("model.layers.*.mlp",), "attention": ("model.layers.*.self_attn",), "router": router, "experts": "experts"}


def test_infer_layout_of_a_dense_model_finds_no_moe_block():
    layout = infer_layout(tiny_model("llama", device="meta"))
    assert layout["moe_block"] == () and "router" not in layout


def _context(record, **degrees):
    return ParallelContext(family=record.family, model_type="qwen3_moe", model_config=None, **degrees)


def test_an_undeclared_split_is_refused_before_any_module_is_touched():
    registry = discover(strict=False)
    record = registry.family_record("olmoe")
    model = tiny_model("olmoe", device="meta")
    with pytest.raises(LayoutError, match=r"does not support tp=2 .* supports \['ep'\]\. Set tp=1"):
        adapt_model(model, registry, record, _context(record, tp=2))


def test_parallelize_checks_the_familys_splits_once(monkeypatch):
    """``plan_layout`` checks the splits; the hooks ``parallelize`` then runs do not check them again (``adapt_model``,
    the public entry, still does: the test above)."""
    from halo_core import ParallelConfig, adapt, parallelize

    calls = []
    checked = adapt.check_splits
    monkeypatch.setattr(adapt, "check_splits", lambda *args: calls.append(args) or checked(*args))
    parallelize(tiny_model("qwen3_moe"), ParallelConfig(fsdp=False))
    assert len(calls) == 1


def test_a_hook_may_replace_the_module_it_is_given(plugin_site):
    plugin_site.add_family(
        "halo-plugin-wrapping", "wrapping", ("solar_open",),
        extra="""
        import torch

        class Tagged(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, *args, **kwargs):
                return self.inner(*args, **kwargs)

        @hookimpl
        def wrap_moe_block(module, context):
            return Tagged(module)
        """,
    )
    registry = discover(strict=False)
    record = registry.family_record("solar_open")
    model = tiny_model("solar_open")
    ids = torch.randint(0, model.config.vocab_size, (2, 5))
    with torch.no_grad():
        before = model(input_ids=ids).logits
        context = ParallelContext(family=record.family, model_type="solar_open", model_config=model.config)
        adapted = adapt_model(model, registry, record, context)
        after = adapted(input_ids=ids).logits
    assert type(adapted.model.layers[0].mlp).__name__ == "Tagged"
    torch.testing.assert_close(after, before, rtol=0, atol=0)
