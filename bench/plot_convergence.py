"""Loss curves of ``sft_vs_trl.py --losses`` runs, and how far each strays from a reference curve.

    python3 bench/plot_convergence.py convergence.json --reference trl-fp32-autocast --out agent-docs/img/convergence.png

Prints, for every other variant, the largest relative difference of its loss from the
reference's at the same step, from ``--from-step`` on (issue 7 asks for 1% from step 50).
Needs matplotlib (not a Halo dependency).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def largest_gap(losses: list[float], reference: list[float], start: int) -> float:
    pairs = list(zip(losses, reference))[start - 1 :]
    return max(abs(a - b) / abs(b) for a, b in pairs) if pairs else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--reference", default="trl-fp32-autocast")
    parser.add_argument("--from-step", type=int, default=50)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = {r["variant"]: r["losses"] for r in json.loads(args.results.read_text())["results"] if r.get("losses")}
    if args.reference not in rows:
        raise SystemExit(f"no losses for the reference {args.reference!r}; have {sorted(rows)}")
    for variant, losses in rows.items():
        if variant != args.reference:
            print(f"{variant}: largest relative gap to {args.reference} from step {args.from_step}: {largest_gap(losses, rows[args.reference], args.from_step):.4f}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for variant, losses in rows.items():
        axes.plot(range(1, len(losses) + 1), losses, label=variant, linewidth=1)
    axes.axvline(args.from_step, color="grey", linewidth=0.5, linestyle="--")
    axes.set_xlabel("step")
    axes.set_ylabel("training loss")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(args.out, dpi=120)


if __name__ == "__main__":
    main()
