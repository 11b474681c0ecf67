"""``halo export --merge``: an adapter folder merged into its base, written as a plain Hugging Face checkpoint.

PEFT's own ``merge_and_unload`` on one process does the arithmetic, so the merged weights are what any PEFT
user gets from the same files.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from halo_core.errors import ConfigError


def merge(adapter_dir: str | Path, out_dir: str | Path) -> Path:
    """Load ``adapter_dir``'s base and adapter with stock transformers and PEFT, merge, save into ``out_dir``."""
    import transformers
    from peft import PeftModel

    from halo_core.lora import peft_format
    from halo_core.trainers.parts.checkpoint import STAGING_PREFIX, publish

    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    if not peft_format.is_adapter_folder(adapter_dir):
        raise ConfigError(f"{adapter_dir} holds no adapter ({peft_format.ADAPTER_CONFIG} and {peft_format.ADAPTER_WEIGHTS}); "
                          f"give the output_dir of a run with use_peft: true, or one of its checkpoint-N folders")
    config = peft_format.read_config(adapter_dir)
    base = config.get("base_model_name_or_path")
    if not base:
        raise ConfigError(f"{adapter_dir}/{peft_format.ADAPTER_CONFIG} names no base_model_name_or_path; set it to the base model's folder or hub id")
    auto = transformers.AutoModelForSequenceClassification if config.get("task_type") == "SEQ_CLS" else transformers.AutoModelForCausalLM
    model = auto.from_pretrained(base, dtype=torch.float32 if _stored_dtype(adapter_dir) == torch.float32 else "auto")
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    staging = out_dir.parent / f".{out_dir.name}.{STAGING_PREFIX}merge"
    shutil.rmtree(staging, ignore_errors=True)
    merged.save_pretrained(staging)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (adapter_dir / name).exists():
            shutil.copy(adapter_dir / name, staging / name)
    publish(staging, out_dir)
    return out_dir


def _stored_dtype(adapter_dir: Path):
    from safetensors import safe_open

    from halo_core.lora.peft_format import ADAPTER_WEIGHTS

    with safe_open(str(adapter_dir / ADAPTER_WEIGHTS), "pt") as handle:
        keys = list(handle.keys())
        return handle.get_tensor(keys[0]).dtype if keys else torch.float32
