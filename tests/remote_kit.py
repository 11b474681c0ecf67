"""A model folder that ships its own modeling code, as a hub release does before transformers merges it: a
Qwen3-MoE renamed to a model type transformers does not know (``halo_remote_moe``), its classes built on
transformers' experts interface, named by ``config.json``'s ``auto_map``. Weights from the tiny Qwen3-MoE."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "templates" / "tiny" / "model"
MODEL_TYPE = "halo_remote_moe"

CONFIGURATION = '''"""The remote model's config: Qwen3-MoE's fields under a model type of its own."""
from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig


class HaloRemoteMoeConfig(Qwen3MoeConfig):
    model_type = "halo_remote_moe"
'''

MODELING = '''"""The remote model's classes: Qwen3-MoE's modules (experts at transformers' experts interface)."""
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeForCausalLM, Qwen3MoeModel, Qwen3MoePreTrainedModel

from .configuration_halo_remote_moe import HaloRemoteMoeConfig


class HaloRemoteMoePreTrainedModel(Qwen3MoePreTrainedModel):
    config_class = HaloRemoteMoeConfig


class HaloRemoteMoeModel(Qwen3MoeModel):
    config_class = HaloRemoteMoeConfig


class HaloRemoteMoeForCausalLM(Qwen3MoeForCausalLM):
    config_class = HaloRemoteMoeConfig
'''

CODE_FILES = ("configuration_halo_remote_moe.py", "modeling_halo_remote_moe.py")


def write_remote_model(folder: Path, *, weights: bool = True) -> Path:
    """``folder`` with the tokenizer, the code files, a config naming them, and (``weights``) seeded weights."""
    from transformers import AutoConfig, Qwen3MoeForCausalLM

    shutil.copytree(TINY, folder)
    (folder / CODE_FILES[0]).write_text(CONFIGURATION)
    (folder / CODE_FILES[1]).write_text(MODELING)
    if weights:  # the remote class's own names (fused experts): no conversion mapping knows this model type
        from safetensors.torch import save_file

        torch.manual_seed(0)
        model = Qwen3MoeForCausalLM(AutoConfig.from_pretrained(TINY))
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((TINY / "config.json").read_text())
    config.update(model_type=MODEL_TYPE, architectures=["HaloRemoteMoeForCausalLM"], auto_map={
        "AutoConfig": "configuration_halo_remote_moe.HaloRemoteMoeConfig",
        "AutoModel": "modeling_halo_remote_moe.HaloRemoteMoeModel",
        "AutoModelForCausalLM": "modeling_halo_remote_moe.HaloRemoteMoeForCausalLM",
    })
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
