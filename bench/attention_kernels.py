"""Attention kernels on one Hopper GPU: PyTorch SDPA's back-ends against FlashAttention-4 (issue 49).

    python3 bench/attention_kernels.py --out attention.json
    python3 bench/attention_kernels.py --seqs 4096 --iters 5 --rounds 2      # a quick look

Every variant is called the way a model calls it: through transformers' attention registry
(``ALL_ATTENTION_FUNCTIONS[name](module, query, key, value, mask, ...)``), with query/key/value as
the projections' transposed views, batch 1, bf16, causal. Two shapes:

* ``qwen3``: the 3B benchmark MoE's attention (``--config``: 32 query heads, 4 key/value heads,
  head dim 128). Variants: ``sdpa`` (PyTorch's own back-end order; the chosen one is recorded),
  ``sdpa-cudnn`` and ``sdpa-flash`` (``sdpa_kernel`` with that one back-end, as Halo's
  ``sdpa_backends`` sets it), ``fa4`` (transformers' ``flash_attention_4``, the
  ``flash-attn-4`` package, CuTe DSL) and ``halo-fa4`` (the same kernels through Halo's custom operators,
  ``halo_core/kernels/flash_attention.py``, which ``torch.compile`` traces without a graph break).
* ``gpt-oss``: gpt-oss-20b's full-attention layers (64 query heads, 8 key/value heads, head dim 64)
  with its per-head attention sinks (``s_aux``). gpt-oss declares no SDPA support; its stock
  paths are ``eager`` (its own ``eager_attention_forward``, sinks concatenated to the scores:
  memory quadratic in the sequence, so only up to ``--eager-max-seq``), ``flex`` (transformers'
  flex attention, sinks applied after it from its log-sum-exp), ``fa4`` and ``halo-fa4`` (``learnable_sink``).

Correctness, in the same invocation, on fresh random inputs: each variant's output and gradients
(query, key, value, sinks) against an fp32 reference, by ||x - ref|| / ||ref|| (bf16 operands land
between 1e-3 and 1e-2). The reference is SDPA's memory-efficient back-end on fp32 copies of the
inputs (qwen3), gpt-oss's eager attention in fp32 up to ``--eager-max-seq``, and above that the
forward alone: fp32 attention times sigmoid(lse - sink), which is what a sink does to the softmax.
The run fails (exit 1, after writing the JSON) if ``fa4`` or ``halo-fa4`` is off by more than 1e-2 or by
more than twice the worst stock variant's error. Each under ``torch.compile`` (as ``compile_layers``
would run it) is checked against itself eager once, and its graph breaks are counted.

Timing: CUDA events around each call, forward (autograd recording, as in training) and
forward+backward, ``--iters`` calls per variant per round, variants alternated within each round
(A/B/C/D, A/B/C/D, ...), medians over all calls; the per-round medians show the spread. Peak memory
is one forward+backward above what the inputs hold. The first call of each variant (``fa4``
compiles its kernels then) is timed on its own.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch

GPT_OSS = {"num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64}  # gpt-oss-20b's attention
QWEN3_VARIANTS = ("sdpa", "sdpa-cudnn", "sdpa-flash", "fa4", "halo-fa4")
DEVICE = "cuda"  # --device cpu: a smoke test of the script itself (no GPU back-ends, no fa4, host timings)
GPT_OSS_VARIANTS = ("eager", "flex", "fa4", "halo-fa4")


class Attention(torch.nn.Module):
    """What transformers' attention functions read off the attention module, and nothing else."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int, implementation: str, sinks: torch.Tensor | None):
        super().__init__()
        self.config = SimpleNamespace(_attn_implementation=implementation)
        self.is_causal = True
        self.layer_idx = 0
        self.num_key_value_groups = heads // kv_heads
        self.head_dim = head_dim
        self.scaling = head_dim**-0.5
        self.sinks = sinks


def sdpa_backend(name: str):
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}
    return sdpa_kernel([backends[name]]) if name in backends else contextlib.nullcontext()


def make_call(variant: str, shape: dict, sinks: torch.Tensor | None, seq: int):
    """fn(q, k, v) -> output [B, S, H, D] for one variant, as the model's attention module would call it."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    heads, kv_heads, head_dim = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    implementation = {"fa4": "flash_attention_4", "halo-fa4": "flash_attention_4", "flex": "flex_attention", "eager": "eager"}.get(variant, "sdpa")
    module = Attention(heads, kv_heads, head_dim, implementation, sinks).to(DEVICE).train()
    extra = {"s_aux": sinks} if sinks is not None else {}
    if variant == "eager":
        from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

        mask = causal_additive_mask(seq, torch.bfloat16)
        return lambda q, k, v: eager_attention_forward(module, q, k, v, mask, scaling=module.scaling, dropout=0.0)[0]
    if variant == "flex":
        from torch.nn.attention.flex_attention import create_block_mask

        block_mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, seq, seq, device=DEVICE)
        function = ALL_ATTENTION_FUNCTIONS["flex_attention"]
        return lambda q, k, v: function(module, q, k, v, block_mask, scaling=module.scaling, **extra)[0]
    function = ALL_ATTENTION_FUNCTIONS[implementation]
    if variant == "halo-fa4":  # Halo's function over its custom operators (halo_core/kernels/flash_attention.py)
        from halo_core.kernels.flash_attention import attention_forward as function
    repeated = Attention(heads, heads, head_dim, implementation, sinks).to(DEVICE).train()

    def call(q, k, v):
        """If the back-end refuses grouped heads (``enable_gqa``), the keys and values repeated, as transformers
        does when it cannot use ``enable_gqa``; ``call.gqa`` records which."""
        with sdpa_backend(variant):
            if call.gqa == "grouped":
                try:
                    return function(module, q, k, v, None, dropout=0.0, scaling=module.scaling, **extra)[0]
                except RuntimeError as exc:
                    if "kernel" not in str(exc) or not variant.startswith("sdpa"):
                        raise
                    call.gqa = "repeat_kv"
            groups = heads // kv_heads
            return function(repeated, q, repeat_kv(k, groups), repeat_kv(v, groups), None, dropout=0.0, scaling=module.scaling, **extra)[0]

    call.gqa = "grouped"
    return call


def causal_additive_mask(seq: int, dtype) -> torch.Tensor:
    allowed = torch.ones(seq, seq, dtype=torch.bool, device=DEVICE).tril()
    return torch.zeros(1, 1, seq, seq, dtype=dtype, device=DEVICE).masked_fill(~allowed, torch.finfo(dtype).min)


def inputs(shape: dict, seq: int, seed: int, with_sinks: bool, dtype=torch.bfloat16):
    """Leaves shaped like the q/k/v projections' outputs [1, S, H*D] (and the sinks), and a gradient for the output.
    Sinks sit near log(S), where they take a sizeable share of each row's softmax at any length."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    heads, kv_heads, head_dim = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    leaves = [torch.randn(1, seq, h * head_dim, device=DEVICE, generator=g, dtype=torch.float32).to(dtype).requires_grad_()
              for h in (heads, kv_heads, kv_heads)]
    sinks = None
    if with_sinks:  # in the model's dtype, as a bf16 model holds them
        sinks = torch.nn.Parameter((math.log(seq) + torch.randn(heads, device=DEVICE, generator=g)).to(dtype))
    grad = torch.randn(1, seq, heads, head_dim, device=DEVICE, generator=g, dtype=torch.float32).to(dtype)
    return leaves, sinks, grad


def views(leaves, shape):
    """[1, S, H*D] -> [1, H, S, D] views, as ``q_proj(x).view(...).transpose(1, 2)`` gives them."""
    head_dim = shape["head_dim"]
    return [t.view(t.shape[0], t.shape[1], -1, head_dim).transpose(1, 2) for t in leaves]


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)


def reference(shape: dict, leaves, sinks, grad, eager_max_seq: int) -> dict:
    """fp32 output and gradients (see the module docstring for which reference at which length)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads, kv_heads, head_dim = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    groups, scale, seq = heads // kv_heads, head_dim**-0.5, leaves[0].shape[1]
    f32 = [t.detach().float().requires_grad_() for t in leaves]
    q, k_grouped, v_grouped = views(f32, shape)
    k, v = repeat_kv(k_grouped, groups), repeat_kv(v_grouped, groups)
    if sinks is None:
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION if DEVICE == "cuda" else SDPBackend.MATH]):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        out = out.transpose(1, 2)
        out.backward(grad.float())
        return {"out": out.detach(), "dq": f32[0].grad, "dk": f32[1].grad, "dv": f32[2].grad}
    sink = sinks.detach().float()
    if seq <= eager_max_seq:
        from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

        sink = sink.requires_grad_()
        module = Attention(heads, kv_heads, head_dim, "eager", sink)
        out = eager_attention_forward(module, q, k_grouped, v_grouped, causal_additive_mask(seq, torch.float32), scaling=scale, dropout=0.0)[0]
        out.backward(grad.float())
        try:  # the reference used above --eager-max-seq, checked here against eager
            long_form = relative(sink_reference(q, k, v, sink.detach(), scale), out.detach())
        except RuntimeError as exc:  # no efficient back-end (the CPU smoke test)
            long_form = f"{type(exc).__name__}: {exc}"[:200]
        return {"out": out.detach(), "dq": f32[0].grad, "dk": f32[1].grad, "dv": f32[2].grad, "dsink": sink.grad,
                "long_reference_vs_eager": long_form}
    return {"out": sink_reference(q, k, v, sink, scale)}


def sink_reference(q, k, v, sink, scale) -> torch.Tensor:
    """fp32 causal attention with sinks, forward only, in O(S) memory: a sink adds exp(sink) to each row's
    normaliser, so the output is plain attention's times exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse - sink)."""
    seq = q.shape[2]
    with torch.no_grad():
        if DEVICE == "cuda":
            out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True, scale=scale)[:2]
        else:  # the CPU smoke test: the same quantities from the whole score matrix
            scores = (q @ k.transpose(2, 3) * scale).masked_fill(~torch.ones(seq, seq, dtype=torch.bool).tril(), float("-inf"))
            out, lse = torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)
        out = out * torch.sigmoid(lse[..., :seq] - sink[None, :, None])[..., None]
    return out.transpose(1, 2).contiguous()


def relative(x: torch.Tensor, ref: torch.Tensor) -> float:
    x = x.float()
    if not torch.isfinite(x).all():
        return float("nan")
    return ((x - ref).norm() / ref.norm()).item()


def check(call, shape, leaves, sinks, grad, ref) -> dict:
    for t in (*leaves, sinks):
        if t is not None:
            t.grad = None
    out = call(*views(leaves, shape))
    errors = {"out": relative(out, ref["out"])}
    if "dq" in ref:
        out.backward(grad)
        errors.update(dq=relative(leaves[0].grad, ref["dq"]), dk=relative(leaves[1].grad, ref["dk"]), dv=relative(leaves[2].grad, ref["dv"]))
        if "dsink" in ref:
            errors["dsink"] = relative(sinks.grad, ref["dsink"])
    return errors


def attention_flops(shape: dict, seq: int) -> float:
    """Causal forward: two matmuls of 2*S*S*D each per head, half of them masked."""
    return 2 * 2 * shape["num_attention_heads"] * seq * seq * shape["head_dim"] / 2


class Timer:
    """CUDA-event times of many calls, read once at the end so the host runs ahead of the GPU."""

    def __init__(self):
        self.pending = []

    def time(self, fn):
        if DEVICE != "cuda":
            start = time.perf_counter()
            fn()
            self.pending.append((time.perf_counter() - start) * 1e3)
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        self.pending.append((start, end))

    def read(self) -> list[float]:
        synchronize()
        times = [p if isinstance(p, float) else p[0].elapsed_time(p[1]) for p in self.pending]
        self.pending = []
        return times


def synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def step(call, shape, leaves, sinks, grad, backward: bool):
    def run():
        for t in (*leaves, sinks):
            if t is not None:
                t.grad = None
        out = call(*views(leaves, shape))
        if backward:
            out.backward(grad)

    return run


def sdpa_choice(shape, leaves) -> str | None:
    """The back-end PyTorch's own order picks for this call (``torch._fused_sdp_choice``)."""
    from torch.nn.attention import SDPBackend

    try:
        q, k, v = views(leaves, shape)
        choice = torch._fused_sdp_choice(q, k, v, None, 0.0, True, scale=shape["head_dim"] ** -0.5, enable_gqa=True)
        names = {int(b): n for n, b in SDPBackend.__members__.items()}
        return names.get(int(choice), str(choice))
    except Exception as exc:  # noqa: BLE001 - a record, not a decision
        return f"unknown ({type(exc).__name__})"


def measure(name: str, shape: dict, variants, seqs, args, sinks_on: bool) -> tuple[list, list]:
    rows, checks = [], []
    for seq in seqs:
        runnable = [v for v in variants if not (v == "eager" and seq > args.eager_max_seq)]
        for v in set(variants) - set(runnable):
            gib = shape["num_attention_heads"] * seq * seq * 2 / 2**30
            rows.append({"shape": name, "seq": seq, "variant": v, "skipped": f"eager scores alone are {gib:.0f} GiB a copy (> --eager-max-seq)"})
        # correctness, fresh inputs
        leaves, sinks, grad = inputs(shape, seq, seed=1000 + seq, with_sinks=sinks_on)
        ref = reference(shape, leaves, sinks, grad, args.eager_max_seq)
        calls, first = {}, {}
        for v in runnable:
            try:
                calls[v] = make_call(v, shape, sinks, seq)
                t0 = time.perf_counter()
                errors = check(calls[v], shape, leaves, sinks, grad, ref)
                synchronize()
                first[v] = time.perf_counter() - t0
                checks.append({"shape": name, "seq": seq, "variant": v, "relative_error": errors, "reference_has_grads": "dq" in ref,
                               "long_reference_vs_eager": ref.get("long_reference_vs_eager")})
                print(f"check {name} {seq} {v}: {errors}", flush=True)
            except Exception as exc:  # noqa: BLE001 - record and go on with the other variants
                calls.pop(v, None)
                checks.append({"shape": name, "seq": seq, "variant": v, "error": f"{type(exc).__name__}: {exc}"[:2000]})
                print(f"check {name} {seq} {v} FAILED: {type(exc).__name__}: {exc}", flush=True)
                traceback.print_exc(limit=3)
        del ref
        # timing, other inputs
        leaves, sinks, grad = inputs(shape, seq, seed=seq, with_sinks=sinks_on)
        choice = sdpa_choice(shape, leaves) if "sdpa" in calls else None
        times = {(v, b): [] for v in calls for b in (False, True)}
        per_round = {key: [] for key in times}
        for v in calls:  # warm-up: compile, autotune, allocator
            for _ in range(args.warmup):
                step(calls[v], shape, leaves, sinks, grad, True)()
        synchronize()
        for _ in range(args.rounds):
            for v in calls:
                for backward in (False, True):
                    timer = Timer()
                    run = step(calls[v], shape, leaves, sinks, grad, backward)
                    for _ in range(args.iters):
                        timer.time(run)
                    got = timer.read()
                    times[(v, backward)] += got
                    per_round[(v, backward)].append(round(statistics.median(got), 4))
        flops = attention_flops(shape, seq)
        for v in calls:
            peak = float("nan")
            if DEVICE == "cuda":
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                step(calls[v], shape, leaves, sinks, grad, True)()
                torch.cuda.synchronize()
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20
            for backward in (False, True):
                ms = statistics.median(times[(v, backward)])
                rows.append({
                    "shape": name, "seq": seq, "variant": v, "pass": "fwd+bwd" if backward else "fwd",
                    "median_ms": round(ms, 4), "round_medians_ms": per_round[(v, backward)],
                    "tflops": round(flops * (3.5 if backward else 1.0) / ms / 1e9, 1),
                    "peak_mib_fwd_bwd": round(peak, 1), "first_call_s": round(first[v], 2),
                    "sdpa_default_backend": choice if v == "sdpa" else None, "gqa": getattr(calls[v], "gqa", None),
                })
        print_rows([r for r in rows if r["seq"] == seq and r["shape"] == name])
        del leaves, sinks, grad
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return rows, checks


def compiled_check(shape: dict, seq: int, variant: str = "fa4") -> dict:
    """A FlashAttention-4 variant inside ``torch.compile`` (as ``compile_layers`` traces a decoder layer) against
    itself eager; dynamo's graph-break counts say whether the compiled layer stays one graph."""
    import torch._dynamo

    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    leaves, sinks, grad = inputs(shape, seq, seed=7, with_sinks=False)
    eager = make_call(variant, shape, None, seq)
    result = {"shape": "qwen3", "seq": seq, "variant": variant}
    try:
        out_e = eager(*views(leaves, shape))
        out_e.backward(grad)
        grads_e = [t.grad.clone() for t in leaves]
        for t in leaves:
            t.grad = None
        compiled = torch.compile(lambda a, b, c: eager(a, b, c) * 1.0)
        out_c = compiled(*views(leaves, shape))
        out_c.backward(grad)
        result["out_relative_difference"] = relative(out_c, out_e.float())
        result["grad_relative_difference"] = [relative(t.grad, g.float()) for t, g in zip(leaves, grads_e)]
        result["graph_breaks"] = sum(counters["graph_break"].values())
        result["graph_break_reasons"] = [reason.split("\n")[0] for reason in counters["graph_break"]]
        timer = Timer()
        run = step(compiled, shape, leaves, sinks, grad, True)
        for _ in range(3):
            run()
        for _ in range(10):
            timer.time(run)
        result["compiled_fwd_bwd_median_ms"] = round(statistics.median(timer.read()), 4)
    except Exception as exc:  # noqa: BLE001
        result["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        traceback.print_exc(limit=5)
    print(f"compiled {variant}: {result}", flush=True)
    return result


def print_rows(rows):
    for r in rows:
        if "skipped" in r:
            print(f"{r['shape']:8} {r['seq']:>6} {r['variant']:11} skipped: {r['skipped']}")
        else:
            print(f"{r['shape']:8} {r['seq']:>6} {r['variant']:11} {r['pass']:8} {r['median_ms']:9.3f} ms {r['tflops']:7.1f} TFLOP/s "
                  f"{r['peak_mib_fwd_bwd']:9.1f} MiB first {r['first_call_s']:.1f}s {r['round_medians_ms']}"
                  + (f" [{r['sdpa_default_backend']}]" if r["sdpa_default_backend"] else ""), flush=True)


def verdict(checks: list) -> list[str]:
    """Where ``fa4`` is wrong: not finite, over 1e-2, or over twice the worst stock variant's error."""
    failures = []
    for c in checks:
        if c["variant"] not in ("fa4", "halo-fa4"):
            continue
        if "error" in c:
            failures.append(f"{c['shape']} {c['seq']}: {c['variant']} raised {c['error'][:200]}")
            continue
        stock = [o["relative_error"] for o in checks if o["shape"] == c["shape"] and o["seq"] == c["seq"] and "fa4" not in o["variant"] and "relative_error" in o]
        for key, err in c["relative_error"].items():
            worst = max((s[key] for s in stock if key in s and math.isfinite(s[key])), default=0.0)
            if not math.isfinite(err) or err > 1e-2 or (worst and err > 2 * worst):
                failures.append(f"{c['shape']} {c['seq']} {key}: {c['variant']} {err:.2e} (worst stock {worst:.2e})")
    return failures


def versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    if DEVICE == "cuda":
        out.update(device=torch.cuda.get_device_name(), capability=list(torch.cuda.get_device_capability()))
    for dist in ("transformers", "flash-attn-4", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-cu13", "quack-kernels", "apache-tvm-ffi", "cuda-bindings"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=Path(__file__).parent / "configs" / "qwen3-moe-3b.config.json",
                        help="model config whose attention shape is the qwen3 row (default: the 3B benchmark MoE)")
    parser.add_argument("--seqs", type=int, nargs="+", default=[4096, 16384, 32768])
    parser.add_argument("--shapes", nargs="+", default=["qwen3", "gpt-oss"], choices=["qwen3", "gpt-oss"])
    parser.add_argument("--variants", nargs="+", help="only these variants (default: every one of each shape)")
    parser.add_argument("--iters", type=int, default=10, help="timed calls per variant per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alternated variants")
    parser.add_argument("--warmup", type=int, default=2, help="untimed forward+backward calls per variant after its check")
    parser.add_argument("--eager-max-seq", type=int, default=4096, help="longest sequence for gpt-oss's eager attention")
    parser.add_argument("--no-compiled-check", action="store_true", help="skip fa4 under torch.compile")
    parser.add_argument("--out", type=Path, help="write every row, check and version here (JSON)")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (tiny --seqs), not a measurement")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    config = json.loads(args.config.read_text())
    qwen3 = {k: config[k] for k in ("num_attention_heads", "num_key_value_heads")}
    qwen3["head_dim"] = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    info = versions()
    print(info, flush=True)
    rows, checks, compiled = [], [], None
    plan = {"qwen3": (qwen3, QWEN3_VARIANTS, False), "gpt-oss": (GPT_OSS, GPT_OSS_VARIANTS, True)}
    for name in args.shapes:
        shape, variants, sinks_on = plan[name]
        variants = [v for v in variants if not args.variants or v in args.variants]
        got_rows, got_checks = measure(name, shape, variants, args.seqs, args, sinks_on)
        rows += got_rows
        checks += got_checks
        if name == "qwen3" and not args.no_compiled_check:
            compiled = [compiled_check(shape, args.seqs[0], v) for v in ("fa4", "halo-fa4") if v in variants]
    failures = verdict(checks)
    result = {"versions": info, "args": {k: str(v) for k, v in vars(args).items()}, "shapes": {"qwen3": qwen3, "gpt-oss": GPT_OSS},
              "rows": rows, "checks": checks, "compiled": compiled, "fa4_failures": failures}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print("\nsummary (median ms):")
    print_rows(rows)
    print("fa4 correctness:", "PASS" if not failures else failures)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
