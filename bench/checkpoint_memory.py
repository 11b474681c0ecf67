"""Each rank's peak memory while a MoE model loads, trains and saves a checkpoint, and the save's wall time, at
several process counts (``expert_parallel_size`` = the count, FSDP2 over the rest), the way a run saves: the
model's Hugging Face files plus the optimizer state (``write_checkpoint``, as ``checkpoint-N``).

CPU (the memory question; gloo, float32):
    .venv/bin/python bench/checkpoint_memory.py --nproc 1 2 4 --out checkpoint-memory.json
GPU (one process; NCCL is not needed):
    python3 bench/checkpoint_memory.py --nproc 1 --device cuda --dtype bfloat16 --out checkpoint-memory-gpu.json

``--variants``: ``sharded`` (today's: every rank writes its part), ``async`` (the same from a host copy, in a
thread; the row times only what the training thread waits), ``gathered`` (what Halo did before issue 43: every
tensor and optimizer state key gathered whole onto rank 0, which wrote the files alone), alternated per count.

Peak memory per phase: the resident set's high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs``
before each phase) on the CPU, ``torch.cuda.max_memory_allocated`` on the GPU. The default model is a
Qwen3-MoE of about 440M parameters (8 layers, hidden 1024, 16 experts of width 1024; ``--layers`` and
``--experts`` change it); it is built once, saved, and every row loads it from there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]


def model_config(layers: int, experts: int):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(ROOT / "templates" / "tiny" / "model")
    config.update({"hidden_size": 1024, "num_hidden_layers": layers, "num_attention_heads": 16, "num_key_value_heads": 4,
                   "head_dim": 64, "intermediate_size": 2048, "moe_intermediate_size": 1024, "num_experts": experts,
                   "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False})
    return config


def _reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # resets VmHWM to the current resident set


def _peak(device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**30
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError("no VmHWM in /proc/self/status")


def _gathered_save(model, optimizer, folder: Path) -> None:
    """Issue 43's 'before': every tensor whole on rank 0, rank 0 writes everything (the code Halo had until then)."""
    from safetensors.torch import save_file

    from halo_core.parallel.conversion import original_classes
    from halo_core.parallel.state_dict import full_state_dict, gather_full

    state = full_state_dict(model)
    if dist.get_rank() == 0:
        with original_classes(model):
            model.save_pretrained(folder, state_dict=state)
    del state
    names = {id(p): n for n, p in model.named_parameters()}
    keys = sorted({k for s in optimizer.state.values() for k, v in s.items() if torch.is_tensor(v) and v.dim()})
    for key in keys:
        full = gather_full(model, [(names[id(p)], s[key]) for p, s in optimizer.state.items() if key in s], device="cpu")
        if dist.get_rank() == 0:
            (folder / "optimizer").mkdir(parents=True, exist_ok=True)
            save_file({n: t.contiguous() for n, t in full.items()}, folder / "optimizer" / f"{key}.safetensors")
        del full
    dist.barrier()


def _check(model, folder: Path, dtype) -> int:
    """The checkpoint, loaded by stock transformers, holds the live model's every tensor (one process only)."""
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).state_dict()
    live = model.state_dict()
    assert loaded.keys() == live.keys(), sorted(loaded.keys() ^ live.keys())[:4]
    for name, tensor in live.items():
        assert torch.equal(loaded[name], tensor.cpu()), name
    return len(live)


def _rank(rank: int, world: int, port: int, args, model_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    device = args.device
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    from halo_core import ParallelConfig, from_pretrained
    from halo_core.trainers.parts import checkpoint

    dtype = getattr(torch, args.dtype)
    row = {"rank": rank, "world": world, "variant": args.variant}
    _reset_peak(device)
    model = from_pretrained(model_dir, ParallelConfig(ep=world), dtype=dtype, device=device if device == "cpu" else f"cuda:{rank}")
    row["load_gib"] = _peak(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    _reset_peak(device)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(args.steps):
        ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), generator=generator).to(device)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    row["train_gib"] = _peak(device)
    folder = Path(out) / f"{args.variant}-{world}"
    dist.barrier()
    _reset_peak(device)
    start = time.perf_counter()
    if args.variant == "gathered":
        _gathered_save(model, optimizer, folder)
    else:
        asynchronous = args.variant == "async"
        staged = Path(checkpoint.staged_checkpoint_root(str(folder)), "checkpoint-1")
        jobs = checkpoint.model_jobs(model, staged, snapshot=asynchronous) + checkpoint.optimizer_jobs(model, optimizer, staged, snapshot=asynchronous)
        pending = checkpoint.write_checkpoint(str(folder), "checkpoint-1", jobs, asynchronous=asynchronous, step=1)
        row["blocked_s"] = time.perf_counter() - start  # what the training thread waits for
        if pending is not None:
            pending.wait()
    dist.barrier()
    row["save_s"] = time.perf_counter() - start
    row["save_gib"] = _peak(device)
    if args.check and world == 1 and args.variant != "gathered":
        row["checked"] = _check(model, folder / "checkpoint-1", dtype)
    dist.destroy_process_group()
    Path(out, f"row-{args.variant}-{world}-{rank}.json").write_text(json.dumps(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--variants", nargs="+", default=["sharded", "gathered"], choices=["sharded", "async", "gathered"])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--check", action="store_true", help="at one process, load each checkpoint with from_pretrained and compare")
    parser.add_argument("--workdir", default=None, help="where the model and the checkpoints go (default: a temporary folder)")
    parser.add_argument("--out", default="checkpoint-memory.json")
    args = parser.parse_args()

    import torch.multiprocessing as mp
    from transformers import AutoModelForCausalLM

    work = Path(args.workdir or tempfile.mkdtemp(prefix="halo-ckpt-bench-"))
    model_dir = work / "model"
    if not (model_dir / "config.json").exists():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(model_config(args.layers, args.experts), dtype=getattr(torch, args.dtype))
        model.save_pretrained(model_dir)
        del model
    config = model_config(args.layers, args.experts)
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    model_gib = params * torch.empty((), dtype=getattr(torch, args.dtype)).element_size() / 2**30
    rows = []
    port = 29600
    for world in args.nproc:
        for variant in args.variants:
            args.variant = variant
            port += 1
            mp.start_processes(_rank, args=(world, port, args, str(model_dir), str(work)), nprocs=world, start_method="spawn")
            for rank in range(world):
                rows.append(json.loads(Path(work, f"row-{variant}-{world}-{rank}.json").read_text()))
            shutil.rmtree(work / f"{variant}-{world}", ignore_errors=True)
            print(json.dumps([r for r in rows if r["world"] == world and r["variant"] == variant]), flush=True)
    result = {"command": " ".join(sys.argv), "parameters": params, "model_gib": model_gib, "device": args.device,
              "device_name": torch.cuda.get_device_name() if args.device == "cuda" else os.uname().machine, "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\nmodel: {params / 1e6:.1f}M parameters, {model_gib:.2f} GiB; target: rank 0's save peak <= its training peak + {0.1 * model_gib:.2f} GiB")
    print(f"{'variant':9} {'N':>2} {'rank':>4} {'load':>7} {'train':>7} {'save':>7} {'save s':>7} {'meets':>6}")
    for r in rows:
        meets = r["save_gib"] <= r["train_gib"] + 0.1 * model_gib
        print(f"{r['variant']:9} {r['world']:>2} {r['rank']:>4} {r['load_gib']:7.2f} {r['train_gib']:7.2f} {r['save_gib']:7.2f} {r['save_s']:7.1f} {str(meets):>6}")


if __name__ == "__main__":
    main()
