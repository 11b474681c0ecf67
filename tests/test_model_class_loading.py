"""A family that names a concrete ``model_class`` (mistral4, the vision-language MoEs) loads and builds at start-up:
concrete transformers classes have ``_from_config`` only, auto classes ``from_config``."""

import pytest
import torch
import transformers

from halo_core.parallel.config import ParallelConfig
from halo_core.parallel.loading import build_from_config, from_pretrained
from halo_core.tiny import tiny_config, tiny_model

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)


def test_a_concrete_class_builds_from_a_config_like_an_auto_class():
    config = tiny_config("qwen3_moe")
    assert not hasattr(transformers.Qwen3MoeForCausalLM, "from_config")
    torch.manual_seed(0)
    concrete = build_from_config(transformers.Qwen3MoeForCausalLM, config, dtype=torch.float32)
    torch.manual_seed(0)
    auto = build_from_config(transformers.AutoModelForCausalLM, config, dtype=torch.float32)
    assert type(concrete) is type(auto)
    assert all(torch.equal(a, b) for a, b in zip(concrete.state_dict().values(), auto.state_dict().values()))


def test_a_family_with_a_concrete_model_class_loads_its_checkpoint(tmp_path):
    model = tiny_model("mistral4", model_class="Mistral4ForCausalLM")  # the bundled mistral4 family names this class
    model.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path, ParallelConfig(fsdp=False), dtype=torch.float32, device="cpu")
    assert type(loaded).__name__ == "Mistral4ForCausalLM"
    theirs = loaded.state_dict()
    assert all(torch.equal(weight, theirs[name]) for name, weight in model.state_dict().items())


def test_experts_stored_transposed_under_their_own_name_load_as_transformers_loads_them(tmp_path):
    """Released qwen3_vl_moe checkpoints hold ``mlp.experts.gate_up_proj`` as [E, H, 2I] for a [E, 2I, H] parameter
    (and ``down_proj`` as [E, I, H]) under the parameter's own name; transformers transposes them on load where the
    shape differs. A non-square size, so a missed transpose cannot pass."""
    from safetensors.torch import load_file, save_file

    model = tiny_model("qwen3_vl_moe", {"text_config": {"moe_intermediate_size": 8}}, model_class="Qwen3VLMoeForConditionalGeneration")
    model.save_pretrained(tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    experts = [k for k in stored if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))]
    assert experts
    save_file({k: (v.transpose(1, 2).contiguous() if k in experts else v) for k, v in stored.items()},
              tmp_path / "model.safetensors", metadata={"format": "pt"})
    reference = transformers.Qwen3VLMoeForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32)
    loaded = from_pretrained(tmp_path, ParallelConfig(fsdp=False), dtype=torch.float32, device="cpu")
    theirs, transformers_own = loaded.state_dict(), reference.state_dict()
    for key, weight in model.state_dict().items():
        assert torch.equal(weight, transformers_own[key]), key  # transformers undoes the layout ...
        assert torch.equal(weight, theirs[key]), key  # ... and so does Halo's sliced loader


#: Composites a family builds whole (its ``model_class`` for the type, or ``AutoModelForCausalLM`` where that maps it),
#: whose checkpoints transformers writes in the composite's layout: Qwen3.5's language-model experts one tensor each.
COMPOSITES = [("gemma4", "gemma4"), ("qwen3-5-moe", "qwen3_5_moe")]


@pytest.mark.parametrize("family, model_type", COMPOSITES, ids=[t for _, t in COMPOSITES])
def test_a_composite_loads_whole_from_the_checkpoint_transformers_writes_and_saves_as_it(tmp_path, family, model_type):
    """The vision tower is loaded too (not dropped by a text-only class), and a save writes the composite's own keys."""
    from safetensors.torch import load_file

    from halo_core.registry import discover
    from halo_core.tiny import tiny_family_model

    model = tiny_family_model(discover(strict=False).by_name(family).family, model_type)
    model.save_pretrained(tmp_path / "in")
    loaded = from_pretrained(tmp_path / "in", ParallelConfig(fsdp=False), dtype=torch.float32, device="cpu")
    assert type(loaded) is type(model) and type(model).__name__.endswith("ForConditionalGeneration")
    theirs = loaded.state_dict()
    assert theirs.keys() == model.state_dict().keys()
    assert all(torch.equal(weight, theirs[name]) for name, weight in model.state_dict().items())
    loaded.save_pretrained(tmp_path / "out")
    written, again = load_file(tmp_path / "in" / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert written.keys() == again.keys() and all(torch.equal(t, again[k]) for k, t in written.items())


def _sliced_composite_load(rank, world, folder):
    import torch.distributed as dist

    from halo_core.parallel.layout_state import layout_of
    from halo_core.registry import discover
    from halo_core.testing.compare import assert_close
    from halo_core.tiny import tiny_family_model

    reference = tiny_family_model(discover(strict=False).by_name("qwen3-5-moe").family, "qwen3_5_moe", seed=7)
    if rank == 0:
        reference.save_pretrained(folder)
    dist.barrier()
    model = from_pretrained(folder, ParallelConfig(ep=2))
    experts = [k for k in layout_of(model).reads if ".experts." in k]
    assert experts and all(k.startswith("model.language_model.") for k in experts)
    local = {int(k.split(".experts.")[1].split(".")[0]) for k in experts}
    assert local == set(range(4 * rank, 4 * rank + 4)), local  # 8 experts at ep=2: only this rank's are opened
    assert any(k.startswith("model.visual.") for k in layout_of(model).reads)
    ids = torch.randint(0, 120, (2, 6), generator=torch.Generator().manual_seed(rank))
    assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits, f"rank {rank}: logits after sliced load")


def test_a_composite_checkpoint_with_one_tensor_per_expert_is_read_for_the_local_experts_only(tmp_path):
    """Qwen3.5 has no conversion mapping of its own: its text part's (``qwen3_5_moe_text``) merges the experts."""
    from halo_core.testing.spawn import spawn

    spawn(_sliced_composite_load, 2, str(tmp_path))
