"""AdamWBF16 on the GPU: the fused Triton kernel against the PyTorch reference, then their speed.

    python3 bench/adamw_bf16.py --out adamw_bf16.json

Correctness: both run three steps on clones of the same random parameter, gradient and
moments (bf16, and the Kahan and fp32-parameter variants); for each stored tensor the
script reports the fraction of elements whose bits differ and the largest difference
relative to the tensor's largest magnitude, and fails if more than 1e-3 of the elements
differ or any difference exceeds 1e-2 of that scale (bf16 precision); fp32 values (the
fp32-parameter mode, Kahan's parameter plus compensation) must agree within 1e-5 of scale. Differences come
from fused multiply-adds, which round once where PyTorch rounds twice; near zero such a
difference can flip the sign of a moment, which is why ulps are not the measure. Speed: one optimizer step over N parameters, median of 50 CUDA-event timings, for
the Triton kernel, the PyTorch reference, and torch.optim.AdamW(fused=True) on fp32
parameters (the classic mixed-precision optimizer), with the bytes each must move.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from halo_core.optim.adamw_bf16 import reference_update
from halo_core.optim.adamw_bf16_triton import fused_update
from halo_core.optim.rounding import stream_key

HYPER = dict(beta1=0.9, one_minus_beta1=1 - 0.9, beta2=0.999, one_minus_beta2=1 - 0.999, eps=1e-8, decay=1 - 1e-4 * 0.01, step_size=1e-4 / (1 - 0.9), bias_correction2_sqrt=(1 - 0.999) ** 0.5)


def make(numel: int, mode: str, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dtype = torch.float32 if mode == "fp32" else torch.bfloat16
    p = (torch.randn(numel, device="cuda", generator=g) * 0.02).to(dtype)
    grad = (torch.randn(numel, device="cuda", generator=g) * 1e-3).to(dtype)
    m = (torch.randn(numel, device="cuda", generator=g) * 1e-4).to(dtype)
    v = (torch.rand(numel, device="cuda", generator=g) * 1e-7).to(dtype)
    c = torch.zeros(numel, device="cuda", dtype=torch.bfloat16) if mode == "kahan" else None
    return [p, grad, m, v], c


def differences(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """(fraction of elements whose bits differ, max |difference| / max |expected|)."""
    bits = torch.int16 if actual.dtype == torch.bfloat16 else torch.int32
    fraction = (actual.view(bits) != expected.view(bits)).float().mean().item()
    scale = expected.float().abs().max().item() or 1.0
    return fraction, (actual.float() - expected.float()).abs().max().item() / scale


def check(numel: int, mode: str) -> dict:
    tensors, comp = make(numel, mode, seed=numel)
    ref = [t.clone() for t in tensors]
    ref_c = comp.clone() if comp is not None else None
    fused = [t.clone() for t in tensors]
    fused_c = comp.clone() if comp is not None else None
    for step in range(1, 4):
        keys = [stream_key(0, step, 1, t) for t in range(3)]
        scale = torch.tensor(0.75, device="cuda") if step == 2 else None  # a clipping factor handed to the step
        reference_update(*ref, ref_c, scale, keys, **HYPER)
        fused_update(*fused, fused_c, scale, keys, **HYPER)
    torch.cuda.synchronize()
    result = {"numel": numel, "mode": mode}
    pairs = [("exp_avg", ref[2], fused[2]), ("exp_avg_sq", ref[3], fused[3])]
    if comp is None:
        pairs.append(("param", ref[0], fused[0]))
    else:  # Kahan: what matters is parameter + compensation, the value the next step starts from
        pairs.append(("param+compensation", ref[0].float() + ref_c.float(), fused[0].float() + fused_c.float()))
    for name, a, b in pairs:
        frac, worst = differences(b, a)
        result[name] = {"fraction_differing": frac, "max_relative_to_scale": worst}
        # bf16-stored values: rare one-ulp flips; fp32 values (fp32 mode, Kahan's sum): last-bit differences only.
        bad = (frac > 1e-3 or worst > 1e-2) if b.dtype == torch.bfloat16 else worst > 1e-5
        if bad:
            raise SystemExit(f"Triton kernel disagrees with the reference: {result}")
    return result


def timed(fn, repeats=50) -> float:
    times = []
    for i in range(repeats + 5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        if i >= 5:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def speed(numel: int) -> list[dict]:
    tensors, _ = make(numel, "sr", seed=1)
    keys = [stream_key(0, 1, 1, t) for t in range(3)]
    rows = [
        ("AdamWBF16 Triton (bf16 p, g, m, v)", 14, lambda: fused_update(*tensors, None, None, keys, **HYPER)),
        ("AdamWBF16 PyTorch reference", 14, lambda: reference_update(*tensors, None, None, keys, **HYPER)),
    ]
    p32 = torch.nn.Parameter(torch.randn(numel, device="cuda"))
    p32.grad = torch.randn(numel, device="cuda")
    classic = torch.optim.AdamW([p32], lr=1e-4, fused=True)
    rows.append(("torch AdamW fused (fp32 p, g, m, v)", 28, classic.step))
    out = []
    for name, bytes_per_param, fn in rows:
        ms = timed(fn)
        out.append({"variant": name, "numel": numel, "median_ms": round(ms, 4), "GB_per_s": round(numel * bytes_per_param / ms / 1e6, 1)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    checks = [check(n, mode) for n in (1_000_003, 16 * 2**20) for mode in ("sr", "kahan", "fp32")]
    for c in checks:
        print(c)
    speeds = speed(256 * 2**20)
    print(f"{'variant':40} {'params':>11} {'ms':>9} {'GB/s':>8}")
    for r in speeds:
        print(f"{r['variant']:40} {r['numel']:>11} {r['median_ms']:>9.3f} {r['GB_per_s']:>8.1f}")
    if args.out:
        args.out.write_text(json.dumps({"checks": checks, "speed": speeds}, indent=2))


if __name__ == "__main__":
    main()
