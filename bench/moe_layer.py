"""Times one MoE layer's forward+backward: transformers' experts implementations at EP=1 against Halo's EP.

Single GPU (EP=1 rows):    python3 bench/moe_layer.py --out moe_ep1.json
Two GPUs   (EP=2 row):     torchrun --nproc-per-node 2 bench/moe_layer.py --ep 2 --out moe_ep2.json
Halo's EP path on one GPU: python3 bench/moe_layer.py --implementations grouped_mm halo_local halo_loopback --compile

``halo_local`` runs Halo's expert-parallel path with every expert on this rank (no exchange; its
dispatcher reads the pair count back, a graph break under ``--compile``);
``halo_loopback`` runs it over a one-rank process group, so the all-to-alls are local copies and
the count read-back happens: what EP costs on one GPU apart from waiting for other ranks.
``--compile`` compiles the block as ``compile_layers`` compiles a decoder layer.

The layer is one Qwen3-MoE sparse block from ../shared/bench/qwen3-moe-3b.config.json
(hidden 2048, 64 experts, top-8, expert width 768) in bf16, random init, fed random
hidden states of --tokens tokens per GPU. Each rank of the EP=2 run first checks its
output and input gradient against the full-expert grouped_mm layer on the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

BENCH_CONFIG = {
    "hidden_size": 2048,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "vocab_size": 1024,  # the layer is what is timed; a small vocabulary keeps the surrounding model cheap
    "num_hidden_layers": 1,
}
TINY_CONFIG = {**BENCH_CONFIG, "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16, "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 128}


def build_model(config_overrides: dict, implementation: str, device: torch.device, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen3_moe", **config_overrides)
    torch.manual_seed(0)
    with device:
        return AutoModelForCausalLM.from_config(config, dtype=dtype, experts_implementation=implementation)


def build_block(config_overrides: dict, implementation: str, device: torch.device, dtype: torch.dtype, compile_block: bool):
    """The model's first MoE block; ``halo_local`` and ``halo_loopback`` put Halo's EP path on one rank."""
    if implementation not in ("halo_local", "halo_loopback"):
        block = build_model(config_overrides, implementation, device, dtype).model.layers[0].mlp
    else:
        from halo_core.parallel import expert_parallel
        from halo_core.parallel.dispatch import TorchAllToAll

        model = build_model(config_overrides, "grouped_mm", device, dtype)
        dispatcher = None
        if implementation == "halo_loopback":
            if not dist.is_initialized():
                dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
            dispatcher = TorchAllToAll(dist.group.WORLD)
        expert_parallel.shard_experts(model.model.layers[0].mlp.experts, 0, 1, dispatcher)
        model.set_experts_implementation(expert_parallel.IMPLEMENTATION)
        block = model.model.layers[0].mlp
    return compiled(block) if compile_block else block


def compiled(block):
    from halo_core.parallel import row_exchange

    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    block.forward = torch.compile(block.forward, options={"joint_custom_pre_pass": row_exchange.KeepExchangesForBackward()})
    return block


def time_layer(block, hidden: torch.Tensor, warmup: int, steps: int, profile: bool = False) -> list[float]:
    """Milliseconds per forward+backward of ``block`` (CUDA events; wall clock on CPU). With
    ``profile``, the timed steps run again under the profiler and its kernel table is printed."""
    grad = torch.randn_like(hidden)
    times = []
    for step in range(warmup + steps):
        x = hidden.detach().requires_grad_(True)
        if hidden.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            import time

            t0 = time.perf_counter()
        out = block(x)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(grad)
        if hidden.is_cuda:
            end.record()
            torch.cuda.synchronize()
            elapsed = start.elapsed_time(end)
        else:
            elapsed = (time.perf_counter() - t0) * 1000
        if step >= warmup:
            times.append(elapsed)
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as profiler

        with profiler(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] if hidden.is_cuda else [ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                x = hidden.detach().requires_grad_(True)
                out = block(x)
                (out[0] if isinstance(out, tuple) else out).backward(grad)
            if hidden.is_cuda:
                torch.cuda.synchronize()
        sort = "self_cuda_time_total" if hidden.is_cuda else "self_cpu_time_total"
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(f"kernels over {steps} steps:\n" + prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=70))
    return times


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--implementations", nargs="+", default=["grouped_mm", "eager"], help="EP=1 rows (batched_mm gathers one weight copy per token-expert pair: 192 GiB at 4k tokens)")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (CPU smoke run)")
    parser.add_argument("--compile", action="store_true", help="compile the block as compile_layers compiles a decoder layer")
    parser.add_argument("--profile", action="store_true", help="print each row's kernel table (profiler over the timed steps, run again)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    overrides = TINY_CONFIG if args.tiny else BENCH_CONFIG
    dtype = torch.bfloat16 if cuda else torch.float32
    rows = []
    if args.ep == 1:
        device = torch.device("cuda" if cuda else "cpu")
        for implementation in args.implementations:
            block = build_block(overrides, implementation, device, dtype, args.compile)
            name = (implementation if implementation.startswith("halo_") else f"transformers {implementation}") + (" compiled" if args.compile else "")
            for tokens in args.tokens:
                hidden = torch.randn(1, tokens, overrides["hidden_size"], device=device, dtype=dtype)
                if implementation.startswith("halo_"):
                    _check_against_full_layer(block, build_model(overrides, "grouped_mm", device, dtype).model.layers[0].mlp, hidden)
                try:
                    times = time_layer(block, hidden, args.warmup, args.steps, args.profile)
                except torch.OutOfMemoryError:
                    rows.append({"variant": name, "ep": 1, "tokens_per_gpu": tokens, "median_ms": float("nan"), "tokens_per_s_per_gpu": "OOM"})
                    torch.cuda.empty_cache()
                    continue
                rows.append(_row(name, 1, tokens, times, device))
    else:
        rows = _expert_parallel_rows(args, overrides, dtype, cuda)
    if not dist.is_initialized() or dist.get_rank() == 0:
        _report(rows, args.out)
    if dist.is_initialized():
        dist.destroy_process_group()


def _expert_parallel_rows(args, overrides, dtype, cuda) -> list[dict]:
    from halo_core import ParallelConfig, parallelize

    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    model = build_model(overrides, "grouped_mm", device, dtype)
    reference = build_model(overrides, "grouped_mm", device, dtype).model.layers[0].mlp
    model = parallelize(model, ParallelConfig(ep=args.ep, fsdp=False))
    block = model.model.layers[0].mlp
    assert block.experts.gate_up_proj.shape[0] == overrides["num_experts"] // args.ep, "experts were not distributed"
    if args.compile:
        block = compiled(block)
    rows = []
    for tokens in args.tokens:
        generator = torch.Generator(device=device).manual_seed(1000 + rank)
        hidden = torch.randn(1, tokens, overrides["hidden_size"], device=device, dtype=dtype, generator=generator)
        errors = _check_against_full_layer(block, reference, hidden)
        times = time_layer(block, hidden, args.warmup, args.steps, args.profile)
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, times)
        slowest = [max(step) for step in zip(*gathered)]  # a step ends when the slowest rank ends
        rows.append({**_row(f"halo EP{args.ep} (torch all-to-all)" + (" compiled" if args.compile else ""), args.ep, tokens, slowest, device), **errors})
    return rows


def _check_against_full_layer(block, reference, hidden) -> dict:
    x_ep, x_ref = hidden.detach().clone().requires_grad_(True), hidden.detach().clone().requires_grad_(True)
    out_ep, out_ref = block(x_ep), reference(x_ref)
    out_ep, out_ref = (o[0] if isinstance(o, tuple) else o for o in (out_ep, out_ref))
    grad = torch.randn_like(out_ref)
    out_ep.backward(grad)
    out_ref.backward(grad)
    errors = {"output_rel_err": relative(out_ep, out_ref), "input_grad_rel_err": relative(x_ep.grad, x_ref.grad)}
    limit = 2e-2 if hidden.dtype == torch.bfloat16 else 1e-5
    if not all(v < limit for v in errors.values()):
        raise SystemExit(f"EP layer disagrees with the full layer: {errors} (limit {limit})")
    return errors


def _row(name: str, ep: int, tokens: int, times: list[float], device) -> dict:
    median = statistics.median(times)
    row = {"variant": name, "ep": ep, "tokens_per_gpu": tokens, "median_ms": round(median, 3), "tokens_per_s_per_gpu": round(tokens / median * 1000)}
    if device.type == "cuda":
        row["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        torch.cuda.reset_peak_memory_stats(device)
    return row


def _report(rows: list[dict], out: Path | None) -> None:
    print(f"{'variant':40} {'EP':>3} {'tokens':>7} {'ms fwd+bwd':>11} {'tokens/s/GPU':>13}")
    for r in rows:
        print(f"{r['variant']:40} {r['ep']:>3} {r['tokens_per_gpu']:>7} {r['median_ms']:>11.3f} {r['tokens_per_s_per_gpu']:>13}")
    if out:
        out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    sys.exit(main())
