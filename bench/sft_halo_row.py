"""A Halo row of ``sft_vs_trl.py``: the ``halo launch sft`` command for a variant, and its row from the logs.

The row runs Halo as a user does (a YAML file and ``halo launch``), so its figure is the
trainer's own logged tokens/s rather than a timer the harness adds.
"""

from __future__ import annotations

import ast
import statistics
import sys
from pathlib import Path

from sft_workload import WARMUP, trainer_fields


def halo_command(variant: str, spec: dict, args, workdir: Path, method: str = "sft", fields: dict | None = None) -> list[str]:
    """``halo launch METHOD`` over a YAML the harness writes (``method``: ``sft``, or ``dpo`` for ``dpo_vs_trl.py``).
    ``fields``: the method's own keys over the shared ones (``methods_vs_trl.py``); a key set to None is left out."""
    import shutil

    import yaml

    # A repeat of the row starts afresh: halo launch refuses an output_dir that holds the last repeat's model (and a
    # checkout from before that refusal, ``--tree``, would not know overwrite_output_dir).
    shutil.rmtree(workdir / "out" / variant, ignore_errors=True)
    run = {
        "model_name_or_path": str(workdir / "model"), "random_init": True, "dataset": [{"path": str(workdir / "data.jsonl")}],
        "expert_parallel_size": spec["ep"], **trainer_fields(spec, args, workdir / "out" / variant),
        "logging_steps": 1 if args.losses else args.halo_log_every,
    }
    for key, value in (fields or {}).items():
        if value is None:
            run.pop(key, None)
        else:
            run[key] = value
    if spec["liger_moe"]:
        run["experts_implementation"] = "liger_moe"
    if spec["compile"]:
        run["compile_layers"] = True
    if spec["activation_budget"] is not None:
        run["activation_memory_budget"] = spec["activation_budget"]
    if spec["kahan"]:
        run["adamw_bf16_kahan"] = True
    if spec["unit_layers"]:
        run["fsdp_unit_layers"] = spec["unit_layers"]
    if spec["replicated"]:
        run["shard_parameters"] = False
    if spec.get("overlap"):
        run["overlap_optimizer_step"] = True
    if spec.get("cudnn"):
        run["sdpa_backends"] = ["cudnn", "flash", "efficient", "math"]
    path = workdir / f"{variant}.yaml"
    path.write_text(yaml.safe_dump(run))
    return [sys.executable, "-m", "halo_cli", "launch", method, str(path), "--nproc", str(args.nproc)]


def unwrapped(output: str) -> str:
    """``output`` with each trainer log on one line again: Halo's console wraps a log's dict at 120 characters
    (``halo_core/trainers/parts/console.py``), its continuation lines indented."""
    lines: list[str] = []
    for line in output.splitlines():
        if lines and lines[-1].startswith("{") and not lines[-1].rstrip().endswith("}") and line.startswith(" "):
            lines[-1] = lines[-1].rstrip() + " " + line.strip()
        else:
            lines.append(line)
    return "\n".join(lines)


def halo_result(output: str, seq: int, batch: int, every: int) -> dict:
    """The median over the logs after warm-up of the trainer's tokens/s, each the average of ``every`` steps."""
    output = unwrapped(output)
    logs = [ast.literal_eval(line) for line in output.splitlines() if line.startswith("{") and "tokens_per_second_per_device" in line]
    skip = -(-WARMUP // every)  # logs covering a warm-up step
    if len(logs) <= skip:
        raise RuntimeError(f"expected a log every {every} steps, got {len(logs)}:\n{output[-3000:]}")
    rates = [float(log["tokens_per_second_per_device"]) for log in logs[skip:]]
    rate = statistics.median(rates)
    return {"tokens_per_s": round(rate), "median_step_s": round(seq * batch / rate, 4), "steps_timed": len(rates) * every,
            "peak_gib": max(float(log.get("peak_memory_gib_per_device", 0.0)) for log in logs),  # none on a CPU dry run
            "losses": [float(log["loss"]) for log in logs]}
