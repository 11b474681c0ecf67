"""What every row of ``sft_vs_trl.py`` trains on: the model folder, the data, the shared trainer settings.

Both trainers get the same fields from one place, so a difference between rows is the variant's
and not a setting one of them forgot.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG = HERE / "configs" / "qwen3-moe-3b.config.json"
TOKENIZER = HERE.parent / "templates" / "tiny" / "model"
#: Steps dropped before timing: compilation, allocator growth and the first collectives.
WARMUP = 5


def prepare(workdir: Path, config: Path, seq: int, rows: int, dataset: Path | None) -> None:
    """A model folder (the benchmark config and the tiny tokenizer) and the data: ``dataset``, or random token rows."""
    model = workdir / "model"
    model.mkdir(parents=True, exist_ok=True)
    shutil.copy(config, model / "config.json")
    for name in os.listdir(TOKENIZER):
        if name.startswith("tokenizer") or name in ("special_tokens_map.json", "chat_template.jinja"):
            shutil.copy(TOKENIZER / name, model / name)
    if dataset is not None:
        shutil.copy(dataset, workdir / "data.jsonl")
        return
    vocab = json.loads(config.read_text())["vocab_size"]
    generator = torch.Generator().manual_seed(0)
    with open(workdir / "data.jsonl", "w") as f:
        for _ in range(rows):
            f.write(json.dumps({"input_ids": torch.randint(0, vocab, (seq,), generator=generator).tolist()}) + "\n")


def trainer_fields(spec: dict, args, output_dir: Path) -> dict:
    fields = {
        "output_dir": str(output_dir), "max_steps": args.steps, "per_device_train_batch_size": args.batch,
        "gradient_checkpointing": spec["checkpointing"], "bf16": True, "learning_rate": args.lr, "logging_steps": 1,
        "save_strategy": "no", "report_to": "none", "max_length": args.seq, "router_aux_loss_coef": 0.0,
        "dataloader_num_workers": 0, "disable_tqdm": True, "seed": 0,
    }
    if spec["liger"]:
        fields["use_liger_kernel"] = True
    if args.packing:
        fields["packing"] = True
    if spec["precompute"]:  # DPO: the reference's log-probabilities scored once before training, no reference in the step
        fields["precompute_ref_log_probs"] = True
    if spec["fsdp"]:
        fields["fsdp"] = "full_shard"
        fields["fsdp_config"] = {"fsdp_version": 2, "transformer_layer_cls_to_wrap": ["Qwen3MoeDecoderLayer"]}
    return fields


def saved_model(workdir: Path, config, dtype: torch.dtype) -> Path:
    """The random initialisation on disk (``from_pretrained`` is where transformers applies a DistributedConfig).
    The orchestrator writes it before the ranks start, so they all read the same weights."""
    folder = workdir / f"saved-{str(dtype).removeprefix('torch.')}"
    if not (folder / "config.json").exists():
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # the CPU: a dry run of the harness
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.save_pretrained(folder)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return folder
