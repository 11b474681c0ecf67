"""Loss curves of ``sft_vs_trl.py --losses`` runs, and how far each strays from a reference curve.

    python3 bench/plot_convergence.py convergence.json --reference trl-fp32-autocast --out agent-docs/img/convergence.png

Prints, for every other variant, the largest relative difference of its loss from the
reference's at the same step, from ``--from-step`` on (the target: within 1% from step 50), per
step and between ``--window``-step means; plots both (thin: per step, thick: means).
Needs matplotlib (not a Halo dependency).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def largest_gap(losses: list[float], reference: list[float], start: int) -> float:
    pairs = list(zip(losses, reference))[start - 1 :]
    return max(abs(a - b) / abs(b) for a, b in pairs) if pairs else float("nan")


def window_means(losses: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` steps' losses at each step (fewer at the start)."""
    return [sum(losses[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(losses))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--reference", default="trl-fp32-autocast")
    parser.add_argument("--from-step", type=int, default=50)
    parser.add_argument("--window", type=int, default=10, help="also compare means over this many steps (batch-1 losses are noisy)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = {r["variant"]: r["losses"] for r in json.loads(args.results.read_text())["results"] if r.get("losses")}
    if args.reference not in rows:
        raise SystemExit(f"no losses for the reference {args.reference!r}; have {sorted(rows)}")
    for variant, losses in rows.items():
        if variant != args.reference:
            reference = rows[args.reference]
            print(f"{variant}: largest relative gap to {args.reference} from step {args.from_step}: per step "
                  f"{largest_gap(losses, reference, args.from_step):.4f}, {args.window}-step means "
                  f"{largest_gap(window_means(losses, args.window), window_means(reference, args.window), args.from_step):.4f}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (axes, gaps) = plt.subplots(2, 1, figsize=(6.4, 6.0), sharex=True, height_ratios=(2, 1))
    reference_means = window_means(rows[args.reference], args.window)
    for variant, losses in rows.items():
        steps = range(1, len(losses) + 1)
        line, = axes.plot(steps, losses, linewidth=0.6, alpha=0.35)
        means = window_means(losses, args.window)
        axes.plot(steps, means, color=line.get_color(), linewidth=1.3, label=f"{variant} ({args.window}-step mean)")
        if variant != args.reference:
            gaps.plot(steps, [100 * (m - r) / r for m, r in zip(means, reference_means)], color=line.get_color(), linewidth=1)
    for panel in (axes, gaps):
        panel.axvline(args.from_step, color="grey", linewidth=0.5, linestyle="--")
        panel.grid(alpha=0.3)
    gaps.axhspan(-1, 1, color="grey", alpha=0.15)
    gaps.set_ylabel(f"% from {args.reference}")
    gaps.set_xlabel("step")
    axes.set_yscale("log")
    axes.set_ylabel("training loss")
    axes.legend(fontsize=8)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(args.out, dpi=120)


if __name__ == "__main__":
    main()
