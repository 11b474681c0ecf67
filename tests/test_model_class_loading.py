"""A family that names a concrete ``model_class`` (mistral4, the vision-language MoEs) loads and builds at start-up:
concrete transformers classes have ``_from_config`` only, auto classes ``from_config``."""

import torch
import transformers

from halo_core.parallel.config import ParallelConfig
from halo_core.parallel.loading import build_from_config, from_pretrained
from halo_core.tiny import tiny_config, tiny_model


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
