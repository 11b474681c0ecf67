"""Stock TRL against Halo's trainer on the same model, data and settings, one GPU (issue 7's baseline).

    python3 bench/sft_vs_trl.py --out sft_vs_trl.json            # every variant, one after another

Variants: stock ``trl.SFTTrainer`` with fp32 weights and bf16 autocast (fp32 AdamW), stock
TRL with bf16 weights (AdamW states in bf16), and ``HaloSFTTrainer`` (the trainer
``halo launch sft`` runs) with bf16 weights and AdamWBF16 at EP=1. Model: the standard
benchmark config (Qwen3-MoE, 64 experts top-8), random init; data: random sequences of
exactly --seq tokens, batch 1, gradient checkpointing on; --steps steps, the first 5
dropped. Reports tokens/s (median step), peak memory (weights included) and MFU:
(6 x active non-embedding parameters incl. lm_head x tokens + causal attention FLOPs)
/ the bf16 matmul rate measured at start on the same GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import torch

CONFIG = Path(__file__).parent / "configs" / "qwen3-moe-3b.config.json"
TOKENIZER = Path(__file__).parents[1] / "templates" / "tiny" / "model"


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
    h, layers = config.hidden_size, config.num_hidden_layers
    heads, kv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    attention = h * (heads * d) * 2 + h * (kv * d) * 2
    experts = config.num_experts_per_tok * 3 * h * config.moe_intermediate_size + h * config.num_experts
    active = layers * (attention + experts) + h * config.vocab_size  # lm_head included, embeddings not
    causal_attention = layers * 2 * 2 * heads * d * seq / 2 * 3  # QK^T and PV, causal half, fwd + bwd
    return 6 * active + causal_attention


def step_timer():
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Wall time of each optimizer step, synchronised with the GPU."""

        def __init__(self):
            self.times, self.last = [], None

        def on_step_begin(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self.last)

    return StepTimer()


def run(variant: str, seq: int, steps: int, rate: float) -> dict:
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from halo_core import ParallelConfig
    from halo_core.trainers.sft import HaloSFTTrainer

    config = AutoConfig.from_pretrained(CONFIG)
    generator = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(0, config.vocab_size, (seq,), generator=generator).tolist()} for _ in range(steps + 2)]
    data = datasets.Dataset.from_list(rows)
    torch.cuda.reset_peak_memory_stats()
    weights = torch.float32 if variant == "trl-fp32-autocast" else torch.bfloat16
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=weights, attn_implementation="sdpa")
    args = SFTConfig(
        output_dir=f"/tmp/bench-{variant}", max_steps=steps, per_device_train_batch_size=1, gradient_checkpointing=True,
        bf16=True, learning_rate=1e-5, logging_steps=1000, save_strategy="no", report_to="none", max_length=seq,
        router_aux_loss_coef=0.0, dataloader_num_workers=0,
    )
    timer = step_timer()
    trainer_class = HaloSFTTrainer if variant.startswith("halo") else SFTTrainer
    extra = {"parallel_config": ParallelConfig()} if variant.startswith("halo") else {}
    # Diagnostic variants that swap only the optimizer, to tell the optimizer's cost from the trainer's.
    if variant.endswith("+torch-adamw"):
        extra["optimizers"] = (torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True), None)
    if variant.endswith("+adamw-bf16"):
        from halo_core.optim import AdamWBF16

        extra["optimizers"] = (AdamWBF16(model.parameters(), lr=1e-5), None)
    trainer = trainer_class(model=model, args=args, train_dataset=data, processing_class=AutoTokenizer.from_pretrained(TOKENIZER), callbacks=[timer], **extra)
    trainer.train()
    step = statistics.median(timer.times[5:])
    result = {
        "variant": variant, "seq": seq, "steps_timed": len(timer.times[5:]), "median_step_s": round(step, 4),
        "tokens_per_s": round(seq / step), "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "mfu": round(flops_per_token(config, seq) * seq / step / rate, 4), "optimizer": type(trainer.optimizer).__name__,
    }
    del trainer, model
    gc.collect()
    torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=["trl-fp32-autocast", "trl-bf16", "halo-ep1"])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rate = matmul_rate()
    print(f"bf16 matmul rate: {rate / 1e12:.1f} TFLOP/s")
    results = [run(v, args.seq, args.steps, rate) for v in args.variants]
    base = {r["variant"]: r["tokens_per_s"] for r in results}
    print(f"{'variant':22} {'tokens/s':>9} {'peak GiB':>9} {'MFU':>6} {'x fp32':>7} {'x bf16':>7}  optimizer")
    for r in results:
        ratios = [r["tokens_per_s"] / base[k] if k in base else float("nan") for k in ("trl-fp32-autocast", "trl-bf16")]
        print(f"{r['variant']:22} {r['tokens_per_s']:>9} {r['peak_gib']:>9} {r['mfu']:>6.3f} {ratios[0]:>7.2f} {ratios[1]:>7.2f}  {r['optimizer']}")
    if args.out:
        args.out.write_text(json.dumps({"matmul_tflops": rate / 1e12, "results": results}, indent=2))


if __name__ == "__main__":
    main()
