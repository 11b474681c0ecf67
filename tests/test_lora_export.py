"""``halo export --merge`` in bounded memory writes what stock PEFT's ``merge_and_unload`` + ``save_pretrained`` write.

Adapters made in process by stock PEFT over tiny bases saved by transformers (its original layout: Qwen3-MoE's experts
one tensor each), each against the reference path on the same folders, tensor for tensor and bit for bit: attention and
router LoRA, fused experts through ``target_parameters``, rsLoRA with rank and alpha patterns, a bf16 base and adapter
(``dtype="auto"``), GPT-2's ``Conv1D`` with ``fan_in_fan_out`` and ``lora_bias`` and tied embeddings, a
sequence-classification adapter's ``score`` (``modules_to_save``), a sharded base, a hub id from transformers' cache.
The export never loads the base whole (``from_pretrained`` forbidden), and a subprocess exporting a base many times
larger than one layer grows its resident memory by a fraction of the model's size. A real run's export is in
``test_lora.py``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from export_kit import assert_same_checkpoint, reference, tensors
from launch_kit import TINY

ROOT = Path(__file__).resolve().parents[1]


def make_base(folder: Path, kind: str, dtype: torch.dtype, **config_overrides):
    """A random tiny model of ``kind`` (``moe``, ``moe-seq-cls``, ``gpt2``) saved by transformers; returns the model."""
    import transformers

    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=128, n_positions=64, **config_overrides)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        config = transformers.AutoConfig.from_pretrained(TINY, **config_overrides)
        if kind == "moe-seq-cls":
            config.num_labels, config.pad_token_id = 1, 0
            model = transformers.AutoModelForSequenceClassification.from_config(config, dtype=dtype)
        else:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(folder, max_shard_size="200KB" if kind == "moe" and not config_overrides else "50GB")
    return model


def make_adapter(model, base: str, folder: Path, adapter_dtype: torch.dtype, **lora):
    """Stock PEFT's adapter over ``model`` (random ``A`` and ``B``: ``init_lora_weights=False``), stored in ``adapter_dtype``."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    peft = get_peft_model(model, LoraConfig(init_lora_weights=False, **lora))
    for name, param in peft.named_parameters():
        if "lora_" in name or "modules_to_save" in name:
            param.data = torch.randn_like(param, dtype=torch.float32).mul_(0.1).to(adapter_dtype)
    peft.peft_config["default"].base_model_name_or_path = base
    peft.save_pretrained(folder)


MOE_TARGETS = {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
               "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight"]}
CASES = {
    # attention, router and fused experts; rsLoRA; per-module rank and alpha; fp32 adapter (merged in float32); a sharded base
    "moe-fp32-rslora-patterns": ("moe", torch.float32, torch.float32,
                                 {**MOE_TARGETS, "r": 4, "lora_alpha": 12, "use_rslora": True, "rank_pattern": {"o_proj": 6}, "alpha_pattern": {"q_proj": 3}}),
    # bf16 base and bf16 adapter: dtype="auto", PEFT's float32 adapter casts and its bf16 additions
    "moe-bf16": ("moe", torch.bfloat16, torch.bfloat16, {**MOE_TARGETS, "r": 4, "lora_alpha": 8}),
    # a sequence-classification adapter: score trained whole (modules_to_save), experts and attention adapted
    "moe-seq-cls-bf16": ("moe-seq-cls", torch.bfloat16, torch.bfloat16, {**MOE_TARGETS, "r": 4, "lora_alpha": 8, "task_type": "SEQ_CLS"}),
    # Conv1D (weights stored in x out): fan_in_fan_out, the adapter's bias merged into the base's, tied embeddings
    "gpt2-fan-in-fan-out-bias": ("gpt2", torch.float32, torch.float32,
                                 {"target_modules": ["c_attn", "c_proj", "c_fc"], "fan_in_fan_out": True, "lora_bias": True, "r": 4, "lora_alpha": 8}),
}


def build_case(tmp_path: Path, name: str) -> tuple[Path, Path]:
    kind, dtype, adapter_dtype, lora = CASES[name]
    base = tmp_path / "base"
    model = make_base(base, kind, dtype)
    make_adapter(model, str(base), tmp_path / "adapter", adapter_dtype, **lora)
    return base, tmp_path / "adapter"


@pytest.mark.parametrize("name", list(CASES))
def test_the_bounded_merge_writes_what_peft_merge_and_unload_writes(tmp_path, name):
    from halo_core.lora.merge import merge

    base, adapter = build_case(tmp_path, name)
    merge(adapter, tmp_path / "ours")
    reference(adapter, tmp_path / "peft")
    assert_same_checkpoint(tmp_path / "ours", tmp_path / "peft")
    merged, stored = tensors(tmp_path / "ours"), tensors(base)
    changed = {k for k in merged if k in stored and not torch.equal(merged[k], stored[k])}
    assert any("experts" in k or "c_attn" in k for k in changed) and any("proj" in k for k in changed), sorted(changed)[:5]
    if name.startswith("moe"):  # transformers' original layout: one tensor per expert, as the base stores them
        assert "model.layers.0.mlp.experts.7.gate_proj.weight" in merged and not any(k.endswith("gate_up_proj") for k in merged)
    if "seq-cls" in name:  # the head is the adapter's own copy, in the base's dtype
        saved = load_file(str(adapter / "adapter_model.safetensors"))["base_model.model.score.weight"]
        assert torch.equal(merged["score.weight"], saved.to(merged["score.weight"].dtype)) and not torch.equal(merged["score.weight"], stored["score.weight"])
    if name.startswith("gpt2"):
        assert "lm_head.weight" not in merged and any(k.endswith("c_attn.bias") for k in changed)


def test_a_merge_in_several_files_has_save_pretrained_s_index_and_loads(tmp_path):
    """Files of at most 200 kB: several, with model.safetensors.index.json naming each tensor's, as transformers reads it."""
    import transformers

    from halo_core.lora.merge import merge

    _, adapter = build_case(tmp_path, "moe-bf16")
    merge(adapter, tmp_path / "whole")
    merge(adapter, tmp_path / "split", max_file_bytes=200_000)
    files = sorted(p.name for p in (tmp_path / "split").glob("*.safetensors"))
    index = json.loads((tmp_path / "split" / "model.safetensors.index.json").read_text())
    assert len(files) > 2 and sorted(set(index["weight_map"].values())) == files
    whole, split = tensors(tmp_path / "whole"), tensors(tmp_path / "split")
    assert sorted(index["weight_map"]) == sorted(split) == sorted(whole) and all(torch.equal(split[k], whole[k]) for k in whole)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "split").state_dict()
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "whole").state_dict()
    assert all(torch.equal(loaded[k], reference[k]) for k in reference)


def test_the_merge_never_loads_the_whole_base(tmp_path, monkeypatch):
    """No from_pretrained of a model (transformers' whole-model load) anywhere inside the export."""
    import transformers

    from halo_core.lora.merge import merge

    _, adapter = build_case(tmp_path, "moe-bf16")

    def refuse(*args, **kwargs):
        raise AssertionError("the export loaded the whole base with from_pretrained")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(refuse))
    monkeypatch.setattr(transformers.models.auto.auto_factory._BaseAutoModelClass, "from_pretrained", classmethod(refuse))
    merge(adapter, tmp_path / "ours")
    assert tensors(tmp_path / "ours")


def test_a_moved_run_merges_onto_the_base_it_carries(tmp_path, monkeypatch):
    """A random-init run's adapter names its base/ by the absolute path it had when trained; moved (a run, and one of its
    checkpoint-N folders), run from another folder, the export merges onto the base/ the run carries, as stock PEFT does
    over that base."""
    import transformers
    from peft import PeftModel

    from halo_core.lora.merge import merge

    run = tmp_path / "old" / "run"
    model = make_base(run / "base", "moe", torch.bfloat16)
    make_adapter(model, str(run / "base"), run, torch.bfloat16, **MOE_TARGETS, r=4, lora_alpha=8)
    (run / "checkpoint-2").mkdir()
    for file in ("adapter_config.json", "adapter_model.safetensors"):
        (run / "checkpoint-2" / file).write_bytes((run / file).read_bytes())
    moved = tmp_path / "new" / "run"
    moved.parent.mkdir()
    run.rename(moved)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    base = transformers.AutoModelForCausalLM.from_pretrained(moved / "base", dtype="auto")
    PeftModel.from_pretrained(base, str(moved)).merge_and_unload().save_pretrained(tmp_path / "peft")
    for adapter in (moved, moved / "checkpoint-2"):
        merge(adapter, tmp_path / f"ours-{adapter.name}")
        assert_same_checkpoint(tmp_path / f"ours-{adapter.name}", tmp_path / "peft")


def test_a_base_path_that_is_nowhere_is_refused_in_one_line(tmp_path):
    """An adapter naming a folder that is not there, with no base/ of its own, is refused naming the key to set."""
    from halo_core.errors import ConfigError
    from halo_core.lora.merge import merge

    base, adapter = build_case(tmp_path, "moe-bf16")
    base.rename(tmp_path / "gone")
    with pytest.raises(ConfigError, match=f"{re.escape(str(base))} .*is not a folder; set base_model_name_or_path") as refused:
        merge(adapter, tmp_path / "ours")
    assert "\n" not in str(refused.value)


#: A Qwen3-MoE of 32 layers (about 300 MB in float32); one layer's fused gate_up_proj, the largest group, is 1/48 of it.
BIG = {"hidden_size": 256, "moe_intermediate_size": 96, "num_experts": 32, "num_hidden_layers": 32, "head_dim": 32}
#: The child's own peak: ``VmHWM`` of its memory map (``ru_maxrss`` would start at the forking parent's resident
#: size), reset to the current size (``clear_refs``) just before the measured export. glibc is told to give blocks of
#: 64 KiB and more back to the system when freed (``MALLOC_MMAP_THRESHOLD_``): by default it keeps freed blocks of up
#: to 32 MiB in its heap for reuse, which the resident size counts though nothing holds them.
_MEASURE = """
import json, sys
from halo_core.lora.merge import merge
merge(sys.argv[1], sys.argv[2])  # warm-up on the tiny model: imports and first-use costs
status = lambda key: int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) * 1024
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS")
merge(sys.argv[3], sys.argv[4])
print(json.dumps({"before": before, "peak": status("VmHWM")}))
"""


@pytest.mark.slow  # measures a merge's peak in its own interpreter
def test_the_merge_holds_a_few_groups_not_the_model(tmp_path):
    """Peak resident memory of an export of a 300 MB base, over the process's resident memory just before it (imports and
    a tiny export done): well under the model's size. The whole-base path holds the model at least once (twice at its peak)."""
    (tmp_path / "small").mkdir()
    _, small = build_case(tmp_path / "small", "moe-fp32-rslora-patterns")
    big = tmp_path / "big"
    model = make_base(big / "base", "moe", torch.float32, **BIG)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    group = model.model.layers[0].mlp.experts.gate_up_proj
    group = group.numel() * group.element_size()
    make_adapter(model, str(big / "base"), big / "adapter", torch.float32, **MOE_TARGETS, r=4, lora_alpha=8)
    del model
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "MALLOC_MMAP_THRESHOLD_": "65536"}
    result = subprocess.run([sys.executable, "-c", _MEASURE, str(small), str(tmp_path / "small-out"), str(big / "adapter"), str(big / "merged")],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    grown = measured["peak"] - measured["before"]
    assert size > 250e6 and group < size / 40
    assert grown < 0.25 * size, f"the export grew resident memory by {grown / 1e6:.0f} MB for a {size / 1e6:.0f} MB model (largest group {group / 1e6:.1f} MB)"
    assert (big / "merged" / "model.safetensors").stat().st_size > size
    print(f"grown {grown / 1e6:.0f} MB, model {size / 1e6:.0f} MB, largest group {group / 1e6:.1f} MB")


@pytest.mark.slow  # a fresh `halo` interpreter loading the stack
def test_a_hub_id_base_is_read_from_transformers_cache(tmp_path):
    """A base named by hub id resolves through transformers' own cache (offline here: nothing is downloaded)."""
    from conftest import run_halo

    base, adapter = build_case(tmp_path, "moe-bf16")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "cache" / "models--halo-test--tiny-moe"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in base.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "halo-test/tiny-moe"
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    env = {"HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    result = run_halo("export", "--merge", str(adapter), str(tmp_path / "ours"), cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    config["base_model_name_or_path"] = str(base)
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    reference(adapter, tmp_path / "peft")
    assert_same_checkpoint(tmp_path / "ours", tmp_path / "peft")
    config["base_model_name_or_path"] = "halo-test/absent"
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    missing = run_halo("export", "--merge", str(adapter), str(tmp_path / "none2"), cwd=tmp_path, env=env)
    assert missing.returncode == 2 and "halo-test/absent" in missing.stderr and "Traceback" not in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
