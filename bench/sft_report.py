"""``sft_vs_trl.py``'s figures: MFU against the measured matmul rate, the results file and the summary.

MFU divides by the bf16 matmul rate measured on the same GPU at the start rather than a data
sheet's peak, so rows from different machines or clocks compare.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch


def matmul_rate() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * 20 / (time.perf_counter() - start)


def flops_per_token(config, seq: int) -> float:
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv, d = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    attention = h * (heads * d) * 2 + h * (kv * d) * 2
    if "num_experts" in config:  # top-k experts and the router
        mlp = config["num_experts_per_tok"] * 3 * h * config["moe_intermediate_size"] + h * config["num_experts"]
    else:
        mlp = 3 * h * config["intermediate_size"]
    active = layers * (attention + mlp) + h * config["vocab_size"]  # lm_head included, embeddings not
    causal_attention = layers * 2 * 2 * heads * d * seq / 2 * 3  # QK^T and PV, causal half, fwd + bwd
    return 6 * active + causal_attention


def with_mfu(row: dict, config: dict, seq: int, rate: float) -> dict:
    if "tokens_per_s" in row:
        row["mfu"] = round(flops_per_token(config, seq) * row["tokens_per_s"] / rate, 4)
    return row


def write(out: Path, rate: float, checks: dict, results: list[dict]) -> None:
    out.write_text(json.dumps({"matmul_tflops": rate / 1e12, "kernel_checks": checks, "results": results}, indent=2))


def print_summary(results: list[dict], workdir: Path, profile: str | None) -> None:
    """The rows side by side with their ratios to stock TRL, then failures, then the profile and memory reports."""
    ok = [r for r in results if "tokens_per_s" in r]
    best = {}
    for r in ok:
        best.setdefault(r["variant"], []).append(r["tokens_per_s"])
    base = {v: statistics.median(t) for v, t in best.items()}
    print(f"\n{'variant':28} {'tokens/s/GPU':>12} {'peak GiB':>9} {'MFU':>6} {'x fp32':>7} {'x bf16':>7}")
    for r in ok:
        ratios = [r["tokens_per_s"] / base[k] if k in base else float("nan") for k in ("trl-fp32-autocast", "trl-bf16")]
        print(f"{r['variant']:28} {r['tokens_per_s']:>12} {r['peak_gib']:>9} {r['mfu']:>6.3f} {ratios[0]:>7.2f} {ratios[1]:>7.2f}")
    print_reports(results, workdir, profile)


def print_reports(results: list[dict], workdir: Path, profile: str | None) -> None:
    """The failed rows' output, then the profile and memory reports a ``--profile`` run wrote."""
    for r in results:
        if "error" in r:
            print(f"{r['variant']}: FAILED\n{r['error']}")
    if profile and (workdir / f"profile-{profile}.txt").exists():
        print((workdir / f"profile-{profile}.txt").read_text())
    for report in sorted(workdir.glob(f"memory-{profile}-rank*.txt")) if profile else []:
        print(f"{report.name}:\n{report.read_text()}")
