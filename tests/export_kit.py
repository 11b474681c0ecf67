"""What the export tests share: today's stock export (PEFT's ``merge_and_unload`` over the whole base, then
``save_pretrained``) as the reference, and a comparison of two checkpoint folders tensor for tensor, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


def reference(adapter: Path, out: Path) -> None:
    """Today's export, the stock path: the whole base through transformers, PEFT's merge_and_unload, save_pretrained."""
    import transformers
    from peft import PeftModel

    config = json.loads((adapter / "adapter_config.json").read_text())
    auto = transformers.AutoModelForSequenceClassification if config.get("task_type") == "SEQ_CLS" else transformers.AutoModelForCausalLM
    stored = next(iter(load_file(str(adapter / "adapter_model.safetensors")).values())).dtype
    model = auto.from_pretrained(config["base_model_name_or_path"], dtype=torch.float32 if stored == torch.float32 else "auto")
    PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().save_pretrained(out)


def assert_same_checkpoint(ours: Path, expected: Path) -> None:
    """Same keys, shapes, dtypes and bits; same config and generation config; our manifest holds the folder."""
    from halo_core.parallel import manifest

    got, want = tensors(ours), tensors(expected)
    assert sorted(got) == sorted(want)
    for key, tensor in want.items():
        assert got[key].dtype == tensor.dtype and got[key].shape == tensor.shape, key
        assert torch.equal(got[key], tensor), f"{key} differs from PEFT's merge_and_unload (max {(got[key].float() - tensor.float()).abs().max()})"
    for name in ("config.json", "generation_config.json"):
        assert (ours / name).exists() == (expected / name).exists(), name
        if (expected / name).exists():
            assert json.loads((ours / name).read_text()) == json.loads((expected / name).read_text()), name
    assert manifest.check(ours) is not None, "the merged folder carries no manifest"
    assert not list(ours.parent.glob(f".{ours.name}.*")), "the staging folder was left behind"
