"""The 3B benchmark MoE's backbone, forward+backward, with ``attn_implementation`` sdpa against flash_attention_4 (issue 49).

    python3 bench/attention_in_model.py --out backbone.json
    python3 bench/attention_in_model.py --seqs 4096 --steps 4 --rounds 1          # a quick look

``bench/attention_kernels.py`` times attention alone; this times what a training step's model part
sees: the decoder layers of ``--config`` (random init, bf16, on one GPU, no checkpointing), one
sequence of random tokens, loss = mean square of the final hidden states, forward+backward. One model;
the variants switch its attention with transformers' ``set_attn_implementation`` (same weights), eager and
with each decoder layer's forward under ``torch.compile`` as Halo's ``compile_layers`` does it, so the
graph breaks flash_attention_4 puts in a compiled layer show in the time. ``halo_fa4`` is
``flash_attention_4`` with Halo's function (``halo_core/kernels/flash_attention.py``: the same kernels as
custom operators, no graph break, no read-back) in transformers' registry. Variants alternate within
each round; the median of CUDA-event step times over all rounds is kept, with each round's median.
Before timing, the final hidden states and a few gradients of each FA4 variant are compared with
``sdpa``'s and with each other (all bf16: the difference is rounding through the layers and the routing
it flips, reported, not judged).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import types
from pathlib import Path

import torch

VARIANTS = ("sdpa", "flash_attention_4", "halo_fa4", "sdpa+compile", "flash_attention_4+compile", "halo_fa4+compile")
DEVICE = "cuda"  # --device cpu: a smoke test of the script with a tiny --config (sdpa variants only)


def build(config_path: Path):
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = json.loads(config_path.read_text())
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    backbone = model.model.train()
    backbone.config.use_cache = False
    return backbone


def compile_layers(backbone) -> None:
    """One ``torch.compile`` of the decoder layer's forward function, bound to every layer (``parts/compile.py``)."""
    compiled = {}
    for layer in backbone.layers:
        function = layer.forward.__func__
        compiled.setdefault(function, torch.compile(function))
        layer.forward = types.MethodType(compiled[function], layer)


def uncompile_layers(backbone) -> None:
    for layer in backbone.layers:
        layer.__dict__.pop("forward", None)


def use_attention(backbone, variant: str) -> None:
    """``halo_fa4``: ``flash_attention_4`` with Halo's function in transformers' registry (as ``halo launch`` puts
    it, for a run without packed documents); ``flash_attention_4``: transformers' own function."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = variant.split("+")[0]
    if name in ("flash_attention_4", "halo_fa4"):
        if name == "halo_fa4":
            from halo_core.kernels import flash_attention

            flash_attention.register(packed_documents=False)
        else:
            ALL_ATTENTION_FUNCTIONS.register("flash_attention_4", TRANSFORMERS_FA4)
        name = "flash_attention_4"
    backbone.set_attn_implementation(name)
    (compile_layers if variant.endswith("+compile") else uncompile_layers)(backbone)


def count_fallbacks():
    """Count the calls Halo's function hands to transformers' ``flash_attention_forward``; returns a reader that undoes it."""
    import transformers.integrations.flash_attention as theirs

    original, calls = theirs.flash_attention_forward, []

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    theirs.flash_attention_forward = counted

    def read() -> int:
        theirs.flash_attention_forward = original
        return len(calls)

    return read


def step(backbone, ids):
    """Forward and backward; the loss projects the final hidden states on a fixed random direction (their mean
    square would be constant after the final RMSNorm, and so give no gradient)."""
    for p in backbone.parameters():
        p.grad = None
    hidden = backbone(input_ids=ids, use_cache=False).last_hidden_state
    probe = torch.randn(hidden.shape[-1], device=hidden.device, generator=torch.Generator(hidden.device).manual_seed(0))
    loss = (hidden.float() @ probe).mean()
    loss.backward()
    return hidden


def synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def timed_steps(backbone, ids, steps: int) -> list[float]:
    """Milliseconds per step: CUDA events, read once at the end (host timer on the CPU smoke test)."""
    if DEVICE != "cuda":
        out = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step(backbone, ids)
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    events = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(backbone, ids)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in events]


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=Path(__file__).parent / "configs" / "qwen3-moe-3b.config.json")
    parser.add_argument("--seqs", type=int, nargs="+", default=[4096, 32768])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per variant per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of this script, not a measurement")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device

    global TRANSFORMERS_FA4
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    TRANSFORMERS_FA4 = ALL_ATTENTION_FUNCTIONS["flash_attention_4"]
    backbone = build(args.config)
    torch._dynamo.config.cache_size_limit = 64
    result = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE, "torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()}, "rows": [], "checks": []}
    for seq in args.seqs:
        ids = torch.randint(0, backbone.config.vocab_size, (1, seq), device=DEVICE)
        # check: flash_attention_4 against sdpa on the same weights and tokens, eager
        reference = {}
        for name in [n for n in ("sdpa", "flash_attention_4", "halo_fa4") if n in {v.split("+")[0] for v in args.variants}]:
            use_attention(backbone, name)
            fallbacks = count_fallbacks() if name == "halo_fa4" else None
            hidden = step(backbone, ids)
            if fallbacks is not None:  # Halo's function handed these calls to transformers' (expected: none here)
                result["checks"].append({"seq": seq, "variant": name, "calls_handed_to_transformers": fallbacks()})
                print(result["checks"][-1], flush=True)
            grads = {n: p.grad.clone() for n, p in backbone.named_parameters() if n.endswith(("layers.0.self_attn.q_proj.weight", "layers.7.self_attn.o_proj.weight", "embed_tokens.weight"))}
            reference[name] = (hidden.detach(), grads)
        for name, against in (("flash_attention_4", "sdpa"), ("halo_fa4", "sdpa"), ("halo_fa4", "flash_attention_4")):
            if name in reference and against in reference:
                check = {"seq": seq, "variant": name, "against": against, "hidden_relative_difference": relative(reference[name][0], reference[against][0]),
                         "grad_relative_difference": {n: relative(g, reference[against][1][n]) for n, g in reference[name][1].items()}}
                result["checks"].append(check)
                print(check, flush=True)
        del reference
        times = {v: [] for v in args.variants}
        rounds = {v: [] for v in args.variants}
        first = {}
        for r in range(args.rounds):
            for variant in args.variants:
                use_attention(backbone, variant)
                if r == 0:  # warm-up (compiles): two steps, the first timed on its own
                    t0 = time.perf_counter()
                    step(backbone, ids)
                    synchronize()
                    first[variant] = round(time.perf_counter() - t0, 1)
                    step(backbone, ids)
                got = timed_steps(backbone, ids, args.steps)
                times[variant] += got
                rounds[variant].append(round(statistics.median(got), 2))
        for variant in args.variants:
            use_attention(backbone, variant)
            peak = float("nan")
            if DEVICE == "cuda":
                torch.cuda.reset_peak_memory_stats()
                step(backbone, ids)
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() / 2**30
            ms = statistics.median(times[variant])
            row = {"seq": seq, "variant": variant, "median_ms": round(ms, 2), "round_medians_ms": rounds[variant], "tokens_per_s": round(seq / ms * 1e3),
                   "peak_gib": round(peak, 2), "first_step_s": first[variant]}
            result["rows"].append(row)
            print(row, flush=True)
        uncompile_layers(backbone)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        if args.out:  # after each length, so a run stopped at its time limit keeps what it measured
            args.out.write_text(json.dumps(result, indent=1))
    print("\nseq      variant                     ms/step   tokens/s  peak GiB")
    for row in result["rows"]:
        print(f"{row['seq']:>6}  {row['variant']:26} {row['median_ms']:9.2f} {row['tokens_per_s']:>9} {row['peak_gib']:9.2f}  {row['round_medians_ms']}")


if __name__ == "__main__":
    main()
