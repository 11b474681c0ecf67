"""Running ``sft_vs_trl.py``'s rows: each variant in its own processes, the variants alternated per repeat.

Alternating (A/B/A/B) within one invocation is what makes two rows comparable: throughput drifts
between leases far more than within one (troubleshooting.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import torch

from sft_halo_row import halo_command, halo_result
from sft_variants import parse, row_process
from sft_workload import HERE, saved_model

ENTRY = HERE / "sft_vs_trl.py"


def run_variant(variant: str, args, workdir: Path, entry: Path = ENTRY, method: str = "sft", sequences: int = 1,
                fields: dict | None = None, worker_args: tuple[str, ...] = ()) -> dict:
    """One row in its own processes: ``halo launch METHOD`` for a Halo row, else ``entry --worker VARIANT``.
    ``sequences``: sequences of ``--seq`` tokens per example (2 for a preference pair), for the step time.
    ``fields``: the method's own keys in a Halo row's YAML (``halo_command``); ``worker_args``: more of the worker's arguments."""
    spec = parse(variant, method)
    if spec["tf_ep"]:
        from transformers import AutoConfig

        saved_model(workdir, AutoConfig.from_pretrained(workdir / "model"), torch.float32 if spec["fp32_weights"] else torch.bfloat16)
    env, cwd = row_process(spec, args.tree)
    if spec["halo"] and not args.profile:
        command = halo_command(variant, spec, args, workdir, method, fields)
    else:
        script = [str(entry), "--worker", variant, "--workdir", str(workdir), "--seq", str(args.seq),
                  "--steps", str(args.steps), "--batch", str(args.batch), "--lr", str(args.lr),
                  "--halo-log-every", str(args.halo_log_every)]
        script += list(worker_args)
        script += (["--profile", variant] if args.profile else []) + (["--memory"] if args.memory else []) + (["--losses"] if args.losses else []) + (["--packing"] if args.packing else [])
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}"] if args.nproc > 1 else [sys.executable]
        command = launcher + script
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=args.timeout)
    except subprocess.TimeoutExpired as expired:  # the row's failure, not the invocation's: the other rows still run
        output = "".join(part.decode(errors="replace") if isinstance(part, bytes) else part or "" for part in (expired.stdout, expired.stderr))
        return {"variant": variant, "error": f"timed out after {args.timeout} s; output's end: {output[-2000:]}"}
    if done.returncode:
        return {"variant": variant, "error": (done.stdout + done.stderr)[-2500:]}
    if spec["halo"] and not args.profile:
        row = halo_result(done.stdout, args.seq * sequences, args.batch, 1 if args.losses else args.halo_log_every)
    else:
        row = json.loads((workdir / f"{variant}.row.json").read_text())
    return {"variant": variant, **row, "wall_s": round(time.perf_counter() - started, 1)}


def alternated_rows(variants: list[str], args, workdir: Path, **harness) -> Iterator[dict]:
    """Every variant once per repeat, in turn, each row as it finishes (``harness``: ``run_variant``'s entry, method, sequences)."""
    for repeat in range(args.repeats):
        for variant in variants:
            yield {"repeat": repeat, "nproc": args.nproc, "seq": args.seq, "batch": args.batch, **run_variant(variant, args, workdir, **harness)}
