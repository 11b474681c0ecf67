"""Throughput against peak memory per GPU from ``sft_vs_trl.py`` results: one point per variant,
Halo's plain EP sweep (``halo-epN``) joined as a line, so the memory each EP degree saves reads against its speed.

    python3 bench/plot_sweep.py bench/results/2026-11-30-sft-vs-trl-h200x2-batch2.json --out agent-docs/img/ep-sweep-h200x2.png

Needs matplotlib (not a Halo dependency: ``pip install matplotlib``).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for path in args.results for r in json.loads(path.read_text())["results"] if "tokens_per_s" in r]
    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    sweep = sorted((int(m.group(1)), r) for r in rows if (m := re.fullmatch(r"halo-ep(\d+)", r["variant"])))
    if sweep:
        axes.plot([r["peak_gib"] for _, r in sweep], [r["tokens_per_s"] for _, r in sweep], "o-", label="Halo, EP sweep")
        for ep, r in sweep:
            axes.annotate(f"EP{ep}", (r["peak_gib"], r["tokens_per_s"]), textcoords="offset points", xytext=(6, 4))
    for r in rows:
        if not re.fullmatch(r"halo-ep\d+", r["variant"]):
            marker = "s" if r["variant"].startswith("trl") else "^"
            axes.plot(r["peak_gib"], r["tokens_per_s"], marker, label=r["variant"])
    world = {r["nproc"] for r in rows}
    batch = {r["batch"] for r in rows}
    axes.set_xlabel("peak memory per GPU (GiB)")
    axes.set_ylabel("tokens/s per GPU")
    axes.set_title(f"Qwen3-MoE 3B benchmark config, {'/'.join(map(str, world))} GPUs, batch {'/'.join(map(str, batch))} x 4,096 per GPU", fontsize=9)
    axes.set_xlim(0, max(r["peak_gib"] for r in rows) * 1.15)
    axes.set_ylim(0, max(r["tokens_per_s"] for r in rows) * 1.15)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="lower right")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(args.out, dpi=120)


if __name__ == "__main__":
    main()
