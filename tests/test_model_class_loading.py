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
