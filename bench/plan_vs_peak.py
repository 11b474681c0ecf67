"""``halo plan``'s total per GPU against the GPU's measured peak (``torch.cuda.max_memory_allocated``) of a short run.

    python bench/plan_vs_peak.py RUN.yaml --method sft --nproc 1 [-- --max_steps=5 ...]

Runs ``halo plan --json`` and then ``halo launch`` with ``HALO_TENSOR_BYTES`` set (each rank writes its tensor bytes
after the first step and its peak at the end, ``halo_core/trainers/parts/tensor_bytes.py``), and prints one Markdown
row per rank: planned total, measured peak, their ratio (target: within 25%), and the planned parts. Without a GPU
it runs the same way and says the peak was not measured (a CPU smoke of the script). Rows go to
``agent-docs/benchmarks.md`` with the card that gave them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

GIB = 1024**3


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--method", default="sft")
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--output-dir", default=None, help="The run's output_dir (default: a temporary folder).")
    args = parser.parse_args(argv)
    halo = [sys.executable, "-m", "halo_cli"]
    with tempfile.TemporaryDirectory(prefix="plan-vs-peak-") as scratch:
        output = args.output_dir or str(Path(scratch) / "run")
        fields = [f"--output_dir={output}", "--save_strategy=no", "--report_to=none", *overrides]
        planned = subprocess.run([*halo, "plan", args.config, "--method", args.method, "--nproc", str(args.nproc), "--json", "--", *fields],
                                 capture_output=True, text=True, check=True)
        plan = json.loads(planned.stdout)
        folder = Path(scratch) / "bytes"
        env = {**__import__("os").environ, "HALO_TENSOR_BYTES": str(folder)}
        subprocess.run([*halo, "launch", args.method, args.config, "--nproc", str(args.nproc), "--", *fields], env=env, check=True)
        print(row_header())
        for rank in range(args.nproc):
            peak_file = folder / f"rank-{rank}-peak.json"
            peak = json.loads(peak_file.read_text())["max_memory_allocated"] if peak_file.exists() else None
            print(row(rank, plan, peak))
    return 0


def row_header() -> str:
    return ("| rank | planned total (GiB) | measured peak (GiB) | planned / peak | parameters | gradients | optimizer | activations | gathered |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def row(rank: int, plan: dict, peak: int | None) -> str:
    per = next((r for r in plan.get("per_rank", []) if r["rank"] == rank), plan["per_gpu"])
    parts = " | ".join(f"{per[k] / GIB:.2f}" for k in ("parameters", "gradients", "optimizer", "activations", "gathered"))
    measured = f"{peak / GIB:.2f}" if peak else "not measured (no GPU)"
    ratio = f"{per['total'] / peak:.2f}" if peak else "-"
    return f"| {rank} | {per['total'] / GIB:.2f} | {measured} | {ratio} | {parts} |"


if __name__ == "__main__":
    raise SystemExit(main())
