"""Stock TRL's ``DPOTrainer`` against ``halo launch dpo`` on the same model, pairs and settings, in one invocation.

    python3 bench/dpo_vs_trl.py --repeats 2 --out dpo_vs_trl.json                        # default rows, one GPU
    python3 bench/dpo_vs_trl.py --variants trl-bf16+nockpt+precompute halo-ep1+compile+nockpt+precompute
    python3 bench/dpo_vs_trl.py --profile halo-ep1+compile+nockpt --steps 10             # where a step's time goes

Variants are ``sft_vs_trl.py``'s (a base and options joined by ``+``, ``sft_variants``), plus one DPO option:

  trl-bf16            stock ``trl.DPOTrainer``, bf16 weights, torch AdamW; its reference is TRL's default for
                      full fine-tuning, a second copy of the model loaded from the policy's folder
  halo-epN            ``halo launch dpo`` at expert_parallel_size N: bf16 weights, AdamWBF16, the frozen
                      reference built and laid out as the policy is (``trainers.runtime.build_reference``)
  +nockpt, +compile, +abNN, +kahan, +unitN, +replicated, +fsdp, +env.NAME=VALUE, +tree.NAME   as in sft_vs_trl.py
  +precompute         ``precompute_ref_log_probs: true``: the reference scores every pair once before training
                      (TRL then uses the policy itself, before its first step), and no step runs a reference

Workload: the standard benchmark config (``configs/qwen3-moe-3b.config.json``), random init (seed 0; stock rows
load it from a saved folder, since TRL builds its reference from the policy's path; Halo's ``random_init`` draws
the same weights), sdpa attention, aux loss off, TRL's default sigmoid loss at beta 0.1. Data: random text pairs
the tiny tokenizer reads at about a token a character, a prompt of about ``--prompt`` tokens and completions long
enough that every chosen and every rejected sequence is cut at exactly ``--seq`` tokens (``max_length``), so a
step of ``--batch`` pairs trains on 2 x seq x batch tokens; checked before any row runs. Both trainers log every
``--halo-log-every`` steps (DPO computes its metrics, with their host reads, at every step anyway) and their
losses are kept, so the rows' loss curves can be compared. TRL rows time each optimizer step (CUDA-synced
callback); Halo rows report the trainer's own logged tokens/s per device, log to log (data loading and logging
included). ``--steps`` steps, the first 5 dropped, the median kept. Peak memory is ``max_memory_allocated``.
MFU counts the policy's forward and backward and, where the step runs one, the reference's forward (4/3 of
``sft_report.flops_per_token``), over the bf16 matmul rate measured at the start.

The pieces are the SFT harness's: variants, workload, the step timer, running and alternating rows, checks and
MFU; this file adds the pairs, the stock DPO worker and the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import string
from pathlib import Path

import torch

from sft_checks import start_measuring
from sft_report import print_reports, with_mfu, write
from sft_rows import alternated_rows
from sft_trl_row import step_timer, write_row
from sft_variants import parse, row_process
from sft_workload import DEFAULT_CONFIG, HERE, prepare, saved_model, trainer_fields

ENTRY = HERE / "dpo_vs_trl.py"
#: ``alternated_rows``' harness for preference pairs: this file's worker, ``halo launch dpo``, two sequences an example.
HARNESS = {"entry": ENTRY, "method": "dpo", "sequences": 2}
DEFAULT_VARIANTS = ["trl-bf16+nockpt", "halo-ep1+compile+nockpt"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    parser.add_argument("--seq", type=int, default=4096, help="tokens of each chosen and each rejected sequence (prompt + completion)")
    parser.add_argument("--prompt", type=int, default=1024, help="about this many of them the prompt's")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--batch", type=int, default=1, help="preference pairs per GPU per step")
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the model's config.json (random init)")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--losses", action="store_true", help="log every step in every row")
    parser.add_argument("--halo-log-every", type=int, default=5, help="every row's logging_steps (Halo's throughput is log to log)")
    parser.add_argument("--profile", help="profile this one variant in-process (steps 6-7) instead of timing rows")
    parser.add_argument("--memory", action="store_true", help="with --profile: what is alive at one step's memory peak, by site")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/halo-dpo-bench"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=DIR", help="a checkout a +tree.NAME row runs")
    parser.set_defaults(packing=False)  # the SFT workload's field; pairs are never packed
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with every variant checked before anything runs."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if any("=" not in t for t in args.tree):
        parser.error("--tree takes NAME=DIR")
    args.tree = {name: Path(folder) for name, folder in (t.split("=", 1) for t in args.tree)}
    if args.memory and not args.profile:
        parser.error("--memory records one step of the --profile run: add --profile VARIANT")
    if args.worker:  # the orchestrator checked the rest
        return args
    if not 0 < args.prompt < args.seq:
        parser.error("--prompt must leave room for a completion in --seq")
    for variant in [args.profile] if args.profile else args.variants:
        spec = parse(variant, "dpo")
        if spec["tf_ep"]:
            parser.error(f"{variant!r}: +tf-ep is an SFT row (sft_vs_trl.py)")
        row_process(spec, args.tree)  # a typo or a missing checkout fails here, not after the first rows ran
    return args


def write_pairs(path: Path, rows: int, prompt: int, seq: int) -> None:
    """Random text pairs: a prompt of ``prompt`` characters, completions of ``seq`` each (so cut at ``max_length``)."""
    draw = random.Random(0)
    alphabet = string.ascii_lowercase + " "
    text = lambda n: "".join(draw.choice(alphabet) for _ in range(n))  # noqa: E731
    with open(path, "w") as f:
        for _ in range(rows):
            f.write(json.dumps({"prompt": text(prompt), "chosen": text(seq), "rejected": text(seq)}) + "\n")


def check_pairs(data: Path, tokenizer_folder: Path, seq: int) -> dict:
    """Every prompt shorter than ``seq`` tokens and every prompt + completion at least ``seq``, as TRL tokenizes them:
    then each sequence is exactly ``seq`` tokens after truncation. Returns the prompts' token counts."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    prompts = []
    for line in data.read_text().splitlines():
        pair = json.loads(line)
        prompt = len(tokenizer(pair["prompt"])["input_ids"])
        shortest = min(len(tokenizer(pair["prompt"] + pair[k])["input_ids"]) for k in ("chosen", "rejected"))
        if not prompt < seq <= shortest:
            raise SystemExit(f"a pair tokenizes to a prompt of {prompt} and a sequence of {shortest} tokens: not every sequence would be {seq}")
        prompts.append(prompt)
    return {"prompt_tokens_min": min(prompts), "prompt_tokens_max": max(prompts), "sequence_tokens": seq}


def prepare_pairs(args) -> dict:
    """The model folder and the pairs every row trains on (``sft_workload.prepare``), checked; stock rows' weights saved."""
    args.workdir.mkdir(parents=True, exist_ok=True)
    pairs = args.workdir / "pairs.jsonl"
    write_pairs(pairs, args.steps * args.batch * args.nproc + 8, args.prompt, args.seq)
    prepare(args.workdir, args.config, args.seq, 0, pairs)
    shape = check_pairs(args.workdir / "data.jsonl", args.workdir / "model", args.seq)
    stock = [spec for spec in (parse(v, "dpo") for v in ([args.profile] if args.profile else args.variants)) if not spec["halo"]]
    if stock:  # TRL builds its reference from the policy's folder: stock rows load the initialisation from disk
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(args.workdir / "model")
        for dtype in {torch.float32 if spec["fp32_weights"] else torch.bfloat16 for spec in stock}:
            saved_model(args.workdir, config, dtype)
    return shape


def dpo_worker(variant: str, args, workdir: Path) -> None:
    """Stock TRL's DPOTrainer (or, for --profile, Halo's built as ``halo launch dpo`` builds it): train, time, write the row."""
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    spec = parse(variant, "dpo")
    rank = int(os.environ.get("RANK", "0"))
    if "LOCAL_RANK" in os.environ:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32 if spec["fp32_weights"] else torch.bfloat16
    data = datasets.load_dataset("json", data_files=str(workdir / "data.jsonl"), split="train")
    tokenizer = AutoTokenizer.from_pretrained(workdir / "model")
    fields = trainer_fields(spec, args, workdir / "out" / variant)
    fields.pop("disable_tqdm")
    fields["logging_steps"] = 1 if args.losses else args.halo_log_every
    if device == "cpu":
        fields["use_cpu"] = True
    dpo_args = DPOConfig(**fields)
    timer = step_timer(variant, args, workdir, rank)
    if spec["halo"]:
        from halo_core import ParallelConfig
        from halo_core.methods.dpo import HaloDPOTrainer
        from halo_core.trainers.arguments import HaloArguments
        from halo_core.trainers.parts.layout import lay_out
        from halo_core.trainers.runtime import build_model, build_reference, init_distributed

        init_distributed()
        halo = HaloArguments(model_name_or_path=str(workdir / "model"), dataset=[], random_init=True)
        parallel = ParallelConfig(ep=spec["ep"], fsdp_unit_layers=spec["unit_layers"] or 1, fsdp=not spec["replicated"])
        model = build_model(halo, dpo_args, parallel)  # what trainers.runtime.train does, in its order
        reference = None if spec["precompute"] else lay_out(build_reference(halo, dpo_args, parallel), parallel)
        trainer = HaloDPOTrainer(model=model, ref_model=reference, args=dpo_args, train_dataset=data,
                                 processing_class=tokenizer, callbacks=[timer], parallel_config=parallel, compile_layers=spec["compile"],
                                 activation_memory_budget=spec["activation_budget"], adamw_bf16_kahan=spec["kahan"],
                                 overlap_optimizer_step=spec["overlap"])
    else:
        weights = saved_model(workdir, AutoConfig.from_pretrained(workdir / "model"), dtype)
        model = AutoModelForCausalLM.from_pretrained(weights, dtype=dtype, attn_implementation="sdpa", device_map=device)
        trainer = DPOTrainer(model=model, args=dpo_args, train_dataset=data, processing_class=tokenizer, callbacks=[timer])
    trainer.train()
    if rank == 0:
        write_row(variant, timer, trainer, 2 * args.seq * args.batch, workdir)


def with_dpo_mfu(row: dict, config: dict, seq: int, rate: float) -> dict:
    """``sft_report.with_mfu``, plus the reference's forward (a third of a training pass) where the step runs one."""
    row = with_mfu(row, config, seq, rate)
    row["reference_in_step"] = not parse(row["variant"], "dpo")["precompute"]
    if "mfu" in row and row["reference_in_step"]:
        row["mfu"] = round(row["mfu"] * 4 / 3, 4)
    return row


def ratios_to_stock(results: list[dict]) -> dict[int, float]:
    """Each timed row's tokens/s over the fastest stock variant's (median over its repeats) with the same
    reference mode (``+precompute`` or not), by the row's index in ``results``."""
    rates: dict[str, list[int]] = {}
    for r in results:
        if "tokens_per_s" in r:
            rates.setdefault(r["variant"], []).append(r["tokens_per_s"])
    stock: dict[bool, float] = {}
    for variant, seen in rates.items():
        spec = parse(variant, "dpo")
        if not spec["halo"]:
            stock[spec["precompute"]] = max(stock.get(spec["precompute"], 0.0), statistics.median(seen))
    ratios = {}
    for i, r in enumerate(results):
        if "tokens_per_s" in r:
            baseline = stock.get(parse(r["variant"], "dpo")["precompute"])
            ratios[i] = r["tokens_per_s"] / baseline if baseline else float("nan")
    return ratios


def print_dpo_summary(results: list[dict], workdir: Path, profile: str | None) -> None:
    ratios = ratios_to_stock(results)
    print(f"\n{'variant':36} {'reference':>9} {'tokens/s/GPU':>12} {'peak GiB':>9} {'MFU':>6} {'x stock':>7}  losses")
    for i, r in enumerate(results):
        if i in ratios:
            losses = " ".join(f"{x:.4f}" for x in r.get("losses", [])[:6])
            print(f"{r['variant']:36} {'in step' if r['reference_in_step'] else 'before':>9} {r['tokens_per_s']:>12} {r['peak_gib']:>9} "
                  f"{r['mfu']:>6.3f} {ratios[i]:>7.2f}  {losses}")
    print("x stock: over the fastest stock TRL variant with the same reference mode (median of its repeats)")
    print_reports(results, workdir, profile)


def main() -> None:
    args = parse_args()
    if args.worker:
        return dpo_worker(args.worker, args, args.workdir)
    shape = prepare_pairs(args)
    print(f"pairs: {json.dumps(shape)}", flush=True)
    rate, config, checks = start_measuring(args.config, args.variants, args.profile)
    results = []
    for row in alternated_rows([args.profile] if args.profile else args.variants, args, args.workdir, **HARNESS):
        row = with_dpo_mfu(row, config, args.seq, rate)
        print(json.dumps(row), flush=True)
        results.append(row)
        if args.out:  # after every row, so a run cut short keeps what it measured
            write(args.out, rate, {**checks, "pairs": shape}, results)
    print_dpo_summary(results, args.workdir, args.profile)


if __name__ == "__main__":
    main()
