"""Long sequences with and without context parallelism: peak memory and tokens/s per GPU.

One (cp, sequence length) point per invocation, so an out-of-memory at one length cannot
hang the other rank's collectives of the next:

    for cp in 1 2; do for seq in 16384 32768 65536 131072; do
      timeout 300 torchrun --nproc-per-node 2 bench/context_parallel.py --cp $cp --seq $seq --out cp${cp}_${seq}.json || break
    done; done

Model: bench/configs/qwen3-moe-3b.config.json (Qwen3-MoE, 64 experts top-8), bf16 weights,
AdamWBF16, gradient checkpointing, random init and random tokens. At cp=1 the two GPUs
train two sequences (data parallel); at cp=2 they train one sequence, half each.
Each step: forward, backward, sync_gradients, clip, optimizer step; median of 4 after 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

CONFIG = Path(__file__).parent / "configs" / "qwen3-moe-3b.config.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cp", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from transformers import AutoConfig, AutoModelForCausalLM

    from halo_core import ParallelConfig, clip_grad_norm_, parallelize, sync_gradients
    from halo_core.optim import AdamWBF16
    from halo_core.parallel.context_parallel import context_parallel_inputs
    from halo_core.parallel.layout_state import layout_of

    dist.init_process_group("nccl", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda", torch.cuda.current_device())
    config = AutoConfig.from_pretrained(CONFIG)
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model = parallelize(model, ParallelConfig(cp=args.cp))
    optimizer = AdamWBF16(model.parameters(), lr=1e-5)
    coords = layout_of(model).dims.coordinates(rank)
    generator = torch.Generator(device=device).manual_seed(coords["dp"])
    ids = torch.randint(0, config.vocab_size, (1, args.seq), device=device, generator=generator)
    inputs = context_parallel_inputs(ids, coords["cp"], args.cp) if args.cp > 1 else {"input_ids": ids, "labels": ids}
    tokens_per_gpu = args.seq // args.cp

    times = []
    for step in range(2 + args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(**inputs).loss
        loss.backward()
        sync_gradients(model)
        clip_grad_norm_(model, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= 2:
            times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    peak = torch.cuda.max_memory_allocated(device) / 2**30
    peaks = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, peak)
    row = {"cp": args.cp, "seq": args.seq, "tokens_per_gpu_per_step": tokens_per_gpu, "median_step_s": round(seconds, 3),
           "tokens_per_s_per_gpu": round(tokens_per_gpu / seconds), "peak_gib_per_gpu": round(max(peaks), 2), "loss": round(loss.item(), 4)}
    if rank == 0:
        print(json.dumps(row))
        if args.out:
            args.out.write_text(json.dumps(row))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
