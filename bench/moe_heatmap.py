"""Routing over training as a picture: ``OUTPUT_DIR/moe_load.jsonl`` drawn as a heatmap (PNG).

    python3 bench/moe_heatmap.py OUTPUT_DIR/moe_load.jsonl --out moe_load.png

One row per (layer, expert), layers stacked top to bottom; one column per logging step. A cell's colour is the
expert's tokens over its layer's mean in that window (1: its fair share; 0, black: dead; bright: overloaded), on a
log scale centred on 1. Balanced routing reads as an even mid-tone; collapse as a few bright rows in a layer and
the rest going dark. Needs matplotlib (``pip install halo[plot]``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def load_ratios(path: Path) -> tuple[list[int], list[str], list[list[float]]]:
    """Steps, row labels (``layer/expert``) and, per row, each step's tokens over the layer's mean (0 for none)."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not records:
        raise SystemExit(f"{path} holds no counts yet (it gets a line at every logging step)")
    steps = [r["step"] for r in records]
    layers = records[0]["layers"]
    labels = [f"{layer}/{e}" for layer, counts in zip(layers, records[0]["counts"]) for e in range(len(counts))]
    columns = []
    for record in records:
        column = []
        for counts in record["counts"]:
            mean = sum(counts) / len(counts)
            column += [c / mean if mean > 0 else 0.0 for c in counts]
        columns.append(column)
    return steps, labels, [list(row) for row in zip(*columns)]


def draw(path: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    steps, labels, rows = load_ratios(path)
    floor = 1 / 16  # a dead expert (0) drawn at the bottom of the scale
    values = [[max(v, floor) for v in row] for row in rows]
    top = max(4.0, max(max(r) for r in values))
    figure, axes = plt.subplots(figsize=(min(4 + len(steps) * 0.15, 20), min(2 + len(labels) * 0.12, 40)))
    image = axes.imshow(values, aspect="auto", interpolation="nearest", cmap="magma", norm=LogNorm(vmin=floor, vmax=top))
    axes.set_xlabel("logging step")
    axes.set_ylabel("layer / expert")
    ticks = range(0, len(steps), max(1, len(steps) // 10))
    axes.set_xticks(list(ticks), [str(steps[i]) for i in ticks])
    per_layer = len(labels) // max(1, len({label.rsplit('/', 1)[0] for label in labels}))
    axes.set_yticks(list(range(0, len(labels), per_layer)), [labels[i].rsplit("/", 1)[0] for i in range(0, len(labels), per_layer)], fontsize=6)
    figure.colorbar(image, ax=axes, label="tokens / layer mean (1 = fair share)")
    axes.set_title(f"MoE load, {len(labels)} (layer, expert) rows, log2 range {math.log2(floor):.0f}..{math.log2(top):.1f}")
    figure.tight_layout()
    figure.savefig(out, dpi=120)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("counts", type=Path, help="OUTPUT_DIR/moe_load.jsonl of a run")
    parser.add_argument("--out", type=Path, default=Path("moe_load.png"))
    args = parser.parse_args()
    draw(args.counts, args.out)


if __name__ == "__main__":
    main()
