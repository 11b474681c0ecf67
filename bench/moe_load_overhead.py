"""What the MoE load metrics (and the routing-bias update) cost a training step: step time with and without them.

    python3 bench/moe_load_overhead.py --out moe_load_overhead.json              # a GPU if there is one
    python3 bench/moe_load_overhead.py --config ../shared/bench/qwen3-moe-3b.config.json --batch 1 --seq 4096
    python3 bench/moe_load_overhead.py --layers 2 --hidden 64 --steps 5          # a quick CPU check

One process, a Qwen3-MoE decoder (``--layers``, ``--hidden``, ``--experts``, ``--top-k``) of random weights in bf16
on a GPU (float32 on CPU), random tokens, AdamW; each variant runs ``--warmup`` steps, then ``--steps`` timed ones
(forward, backward, optimizer step, synchronised), the metrics read every ``--logging-steps`` as the trainer reads
them. Variants: ``off`` (no hooks), ``metrics`` (``parts/moe_load.py``'s pre-hooks and the read at logging steps),
``metrics+bias`` (also the per-step table the bias rule reads, ``parts/moe_bias.py``'s ``step_table``). Prints and
writes the median step time of each (the best of ``--rounds`` interleaved rounds) and the overhead against ``off``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch


def build(args, device, dtype):
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3MoeConfig

    if args.config:  # a published model's figures, e.g. ../shared/bench/qwen3-moe-3b.config.json
        config = AutoConfig.for_model(**json.loads(args.config.read_text()))
        torch.manual_seed(0)
        with device:  # initialised where it trains: a 3B model's CPU init would take longer than its timing
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
    config = Qwen3MoeConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 2, moe_intermediate_size=args.hidden // 2,
                            num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 128), num_key_value_heads=max(1, args.hidden // 512),
                            head_dim=128 if args.hidden >= 128 else args.hidden, num_experts=args.experts, num_experts_per_tok=args.top_k,
                            output_router_logits=False)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).to(device)


def run(args, variant: str, device, dtype) -> float:
    from halo_core.trainers.parts.moe_load import MoeLoad, experts_modules

    model = build(args, device, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    load = None
    if variant != "off":
        load = MoeLoad(experts_modules(model), SimpleNamespace(dims=SimpleNamespace(tp=1)))
        load.track_steps = variant == "metrics+bias"
    times = []
    for step in range(args.warmup + args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        if load is not None:
            load.begin(None, True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if load is not None and load.track_steps:
            load.step_table(device)
        if load is not None and (step + 1) % args.logging_steps == 0:
            load.drain(device)  # the one read-back, as at a logging step
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def config_of(args) -> dict:
    """The flags that shaped the run: the size flags only where no ``--config`` replaced them."""
    config = vars(args) | {"out": None, "config": args.config and str(args.config)}
    if args.config:
        for key in ("layers", "hidden", "experts", "top_k", "vocab"):
            config.pop(key)
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, help="a model's config.json (overrides the size flags)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--logging-steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the three variants; the best median counts")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    variants = ("off", "metrics", "metrics+bias")
    rounds = {variant: [] for variant in variants}
    for _ in range(args.rounds):  # interleaved, so drift (clocks, a shared machine) falls on every variant alike
        for variant in variants:
            rounds[variant].append(run(args, variant, device, dtype))
    results = {variant: min(times) for variant, times in rounds.items()}
    base = results["off"]
    report = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "config": config_of(args),
              "median_step_s": results, "overhead_pct": {k: round(100 * (v / base - 1), 2) for k, v in results.items() if k != "off"}}
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
