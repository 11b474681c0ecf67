import pytest

from halo_core import PLUGIN_API_VERSION, Family


def make(**kw):
    args = dict(name="fam", model_types=("qwen3_moe",), version="1", api_version=PLUGIN_API_VERSION)
    args.update(kw)
    return Family(**args)


def test_strings_become_tuples_and_splits_a_frozenset():
    family = make(model_types="qwen3_moe", moe_block="a.*.b", splits=["ep"])
    assert family.model_types == ("qwen3_moe",)
    assert family.moe_block == ("a.*.b",)
    assert family.splits == frozenset({"ep"})


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(name="Bad Name"), "Family.name='Bad Name'"),
        (dict(name=""), "Family.name=''"),
        (dict(model_types=()), "Family.model_types=()"),
        (dict(splits={"ep", "zp"}), "['zp']"),
        (dict(api_version="1"), "api_version='1'"),
        (dict(model_class={"qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration"}), "['qwen3_vl_moe'] are not claimed"),
        (dict(model_class={"qwen3_moe": ""}), "must map claimed model types"),
    ],
)
def test_bad_declarations_name_the_field_and_value(kw, needle):
    with pytest.raises(ValueError, match=None) as info:
        make(**kw)
    assert needle in str(info.value)


def test_model_class_names_one_class_for_every_type_or_one_per_type():
    """A composite and its text part claimed together need different classes (Qwen3.5's)."""
    one = make(model_types=("a", "b"), model_class="XForCausalLM")
    assert one.class_for("a") == one.class_for("b") == "XForCausalLM"
    per_type = make(model_types=("x", "x_text"), model_class={"x": "XForConditionalGeneration"})
    assert per_type.class_for("x") == "XForConditionalGeneration" and per_type.class_for("x_text") is None
    assert make().class_for("qwen3_moe") is None
