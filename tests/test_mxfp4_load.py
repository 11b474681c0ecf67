"""gpt-oss's hub release stores its experts in MXFP4 (``*_blocks`` and ``*_scales``, ``quantization_config``); Halo
reads such a checkpoint dequantised to bf16 as transformers' ``Mxfp4Config(dequantize=True)`` does, each rank only its
experts' blocks, and trains and saves plain bf16. The checkpoint is a tiny one the test writes."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from halo_core.tiny import tiny_config
from launch_kit import TINY

EXPERTS, HIDDEN, INTERMEDIATE = 4, 64, 64  # MXFP4 packs 32 values a scale: both widths multiples of 32


@pytest.fixture(scope="module")
def mxfp4_folder(tmp_path_factory):
    """A gpt-oss folder as the hub release is laid out: bf16 everywhere but the experts' projections, which are random
    FP4 blocks and exponents (``[E, out, in/32, 16]`` bytes and ``[E, out, in/32]``), and ``quantization_config``."""
    from transformers import GptOssForCausalLM

    folder = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    config = tiny_config("gpt_oss", {"hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_local_experts": EXPERTS,
                                     "num_experts_per_tok": 2, "num_hidden_layers": 2, "vocab_size": 320, "head_dim": 16,
                                     "num_attention_heads": 4, "num_key_value_heads": 2})
    torch.manual_seed(0)
    GptOssForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    weights = load_file(folder / "model.safetensors")
    draw = torch.Generator().manual_seed(1)
    for key in [k for k in weights if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        inner, outer = weights.pop(key).shape[1:]  # the parameter is [E, in, out]; the blocks are stored out-major
        weights[key + "_blocks"] = torch.randint(0, 256, (EXPERTS, outer, inner // 32, 16), dtype=torch.uint8, generator=draw)
        weights[key + "_scales"] = torch.randint(120, 130, (EXPERTS, outer, inner // 32), dtype=torch.uint8, generator=draw)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    settings = json.loads((folder / "config.json").read_text())
    settings["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(settings))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TINY / name, folder / name)
    return folder


def test_loads_the_weights_transformers_dequantises(mxfp4_folder):
    """Every weight equals transformers' own dequantised load, and the loaded config keeps no quantization_config."""
    from transformers import GptOssForCausalLM, Mxfp4Config

    from halo_core.parallel.config import ParallelConfig
    from halo_core.parallel.loading import from_pretrained

    expected = GptOssForCausalLM.from_pretrained(mxfp4_folder, quantization_config=Mxfp4Config(dequantize=True), dtype=torch.bfloat16).state_dict()
    model = from_pretrained(mxfp4_folder, ParallelConfig(), dtype=torch.bfloat16)
    actual = model.state_dict()
    assert actual.keys() == expected.keys()
    for key, tensor in actual.items():
        assert torch.equal(tensor, expected[key]), key
    assert actual["model.layers.0.mlp.experts.down_proj"].abs().sum() > 0
    assert not getattr(model.config, "quantization_config", None)


def test_the_launcher_accepts_mxfp4_and_still_refuses_other_quantisations(mxfp4_folder, tmp_path):
    from halo_core.errors import ConfigError
    from halo_core.trainers.run_checks import check_model_source

    class Run:
        source = str(tmp_path / "run.yaml")

        class halo:
            model_name_or_path = str(mxfp4_folder)

    check_model_source(Run)
    other = tmp_path / "fp8"
    shutil.copytree(mxfp4_folder, other)
    settings = json.loads((other / "config.json").read_text())
    settings["quantization_config"] = {"quant_method": "fp8"}
    (other / "config.json").write_text(json.dumps(settings))
    Run.halo.model_name_or_path = str(other)
    with pytest.raises(ConfigError, match="quantised checkpoint"):
        check_model_source(Run)


def test_trains_and_saves_plain_bf16(mxfp4_folder, tmp_path):
    """One step at ep=2 as one process would be a launch; the in-process road (world 1) trains and saves: the saved
    folder holds bf16 projections under their plain names and a config without quantization_config."""
    from halo_core.trainers.method import get_method
    from halo_core.trainers.run_config import load_run_config

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"{i} + {i}"}],
                                        "completion": [{"role": "assistant", "content": str(2 * i)}]}) + "\n" for i in range(8)))
    config = tmp_path / "run.yaml"
    config.write_text(f"model_name_or_path: {mxfp4_folder}\ndataset:\n  - path: rows.jsonl\n")
    method = get_method("sft")
    out = tmp_path / "out"
    run = load_run_config("sft", method.config_class, config, {"output_dir": str(out), "max_steps": 1, "per_device_train_batch_size": 2,
                                                               "bf16": True, "report_to": "none", "save_strategy": "no", "max_length": 32})
    method.run(run)
    saved = load_file(out / "model.safetensors")
    assert saved["model.layers.0.mlp.experts.down_proj"].dtype == torch.bfloat16
    assert not any(k.endswith(("_blocks", "_scales")) for k in saved)
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
