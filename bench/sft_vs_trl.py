"""Stock TRL against ``halo launch sft`` on the same model, data and settings, in one invocation.

    python3 bench/sft_vs_trl.py --out sft_vs_trl.json                       # default rows, one GPU
    python3 bench/sft_vs_trl.py --nproc 2 --batch 2 --variants trl-bf16+fsdp halo-ep1 halo-ep2
    python3 bench/sft_vs_trl.py --profile halo-ep1 --out profile.json       # where a step's time goes (+ trace-rank*.json)
    python3 bench/sft_vs_trl.py --profile halo-ep1 --memory                 # ... and what is alive at the memory peak
    python3 bench/sft_vs_trl.py --config bench/configs/qwen3-dense-1b.config.json --variants trl-bf16 halo-ep1   # dense row
    python3 bench/sft_vs_trl.py --dataset templates/tiny/data/arithmetic.jsonl --packing --steps 200 --lr 1e-4 \
        --losses --variants trl-fp32-autocast halo-ep1 --out convergence.json            # loss curves
    python3 bench/plot_convergence.py convergence.json --out agent-docs/img/convergence.png

A variant is a base and options joined by ``+``:

  trl-fp32-autocast   stock ``trl.SFTTrainer``, fp32 weights, bf16 autocast, fp32 AdamW (classic mixed precision)
  trl-bf16            stock TRL, bf16 weights, torch AdamW (its states bf16 too)
  halo-epN            ``halo launch sft`` at expert_parallel_size N: bf16 weights, AdamWBF16
  +liger              TRL's ``use_liger_kernel`` (RoPE, RMSNorm, fused linear cross-entropy; for Halo
                      the experts stay at transformers' experts interface)
  +liger-moe          Halo: Liger's fused MoE as the experts implementation (``experts_implementation``)
  +nockpt             gradient checkpointing off
  +compile            Halo: ``compile_layers: true`` (torch.compile on each decoder layer)
  +abNN               with +compile: ``activation_memory_budget: 0.NN`` (selective recomputation)
  +kahan              Halo: ``adamw_bf16_kahan: true`` (a bf16 compensation buffer instead of stochastic rounding)
  +unitN              Halo: ``fsdp_unit_layers: N`` (N consecutive decoder layers per FSDP2 unit)
  +replicated         Halo: ``shard_parameters: false`` (no FSDP2: weights whole on every GPU, gradients all-reduced)
  +overlap            Halo, with +replicated: ``overlap_optimizer_step: true`` (the step on a side stream, overlapped
                      with the next forward)
  +cudnn              Halo: ``sdpa_backends: [cudnn, flash, efficient, math]`` (cuDNN's attention first)
  +fsdp               stock TRL with FSDP2 full sharding over the GPUs (else DDP)
  +tf-ep              stock TRL on transformers' own expert parallelism: ``from_pretrained(distributed_config=
                      DistributedConfig(ep_size=N, fsdp_size=N, ep_implementation="all_to_all"))``, N = --nproc
  +env.NAME=VALUE     the variant's processes run with that environment variable: an experiment's switch,
                      timed against the plain row in one lease with ``--repeats 2`` (rows alternate)
  +tree.NAME          Halo: the row runs the halo_core and halo_cli of the checkout ``--tree NAME=DIR`` names
                      (e.g. ``git archive COMMIT | tar -x -C DIR``): two code versions alternated in one lease

Each variant runs in its own processes (a fresh CUDA context), ``--repeats`` times, in turn.
Workload: the standard benchmark config (``configs/qwen3-moe-3b.config.json``: Qwen3-MoE,
64 experts top-8, vocab 151,936; ``--config`` for another, e.g. the dense
``configs/qwen3-dense-1b.config.json``), random init, random sequences of exactly ``--seq``
tokens (``--dataset`` for a real one, with the embedded tokenizer; ``--losses`` keeps every step's loss),
``--batch`` per GPU, gradient checkpointing on, sdpa attention, aux loss off; ``--steps``
steps, the first 5 dropped, the median kept. TRL rows time each optimizer step (CUDA-synced
callback); Halo rows report the trainer's own logged tokens/s per device, log to log, at
``logging_steps=1`` (so a little pessimistic for Halo: TRL computes and gathers its metrics
at every log; ``--halo-log-every 5`` logs, and so averages, over five steps). Peak memory is
``torch.cuda.max_memory_allocated`` (weights included). MFU = (6 x active non-embedding
parameters including lm_head + causal attention FLOPs) per token x tokens/s / the bf16
matmul rate measured at the start on the same GPU.

This file is the command line; the harness's parts sit beside it, one concern each:
``sft_variants`` (names), ``sft_workload`` (model, data, shared settings), ``sft_trl_row`` and
``sft_halo_row`` (the two kinds of row), ``sft_rows`` (running and alternating them),
``sft_checks`` (GPU equivalence first) and ``sft_report`` (MFU, results file, summary).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from sft_checks import checks_for
from sft_report import matmul_rate, print_summary, with_mfu, write
from sft_rows import alternated_rows
from sft_trl_row import trl_worker
from sft_variants import parse, row_process
from sft_workload import DEFAULT_CONFIG, prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=["trl-fp32-autocast", "trl-bf16", "halo-ep1"])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the model's config.json (random init)")
    parser.add_argument("--dataset", type=Path, help="a .jsonl dataset (default: random token rows)")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--losses", action="store_true", help="keep every step's loss (TRL rows then log every step too)")
    parser.add_argument("--packing", action="store_true", help="pack the dataset's documents into --seq-token rows")
    parser.add_argument("--halo-log-every", type=int, default=1, help="Halo rows' logging_steps (their throughput is log to log)")
    parser.add_argument("--profile", help="profile this one variant in-process (steps 6-7) instead of timing rows")
    parser.add_argument("--memory", action="store_true", help="with --profile: what is alive at one step's memory peak, by site (memory-*.txt)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/halo-bench"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=DIR", help="a checkout a +tree.NAME row runs")
    args = parser.parse_args()
    if any("=" not in t for t in args.tree):
        parser.error("--tree takes NAME=DIR")
    args.tree = {name: Path(folder) for name, folder in (t.split("=", 1) for t in args.tree)}
    if args.memory and not args.profile:
        parser.error("--memory records one step of the --profile run: add --profile VARIANT")
    if args.worker:
        return trl_worker(args.worker, args, args.workdir)
    for variant in [args.profile] if args.profile else args.variants:
        row_process(parse(variant), args.tree)  # a typo or a missing checkout fails here, not after the first rows ran
    prepare(args.workdir, args.config, args.seq, args.steps * args.batch * args.nproc + 8, args.dataset)
    rate = matmul_rate()
    torch.cuda.empty_cache()
    config = json.loads(args.config.read_text())
    print(f"bf16 matmul rate: {rate / 1e12:.1f} TFLOP/s", flush=True)
    checks = checks_for(args.variants, args.config, args.profile)
    if checks:
        print(f"kernel checks (relative error, bf16): {json.dumps(checks)}", flush=True)
    results = []
    for row in alternated_rows([args.profile] if args.profile else args.variants, args, args.workdir):
        row = with_mfu(row, config, args.seq, rate)
        print(json.dumps(row), flush=True)
        results.append(row)
        if args.out:  # after every row, so a run cut short keeps what it measured
            write(args.out, rate, checks, results)
    print_summary(results, args.workdir, args.profile)


if __name__ == "__main__":
    main()
