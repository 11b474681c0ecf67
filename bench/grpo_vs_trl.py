"""Stock TRL's ``GRPOTrainer`` against ``halo launch grpo``: throughput of the GRPO *update*, same model, prompts, shapes.

    python3 bench/grpo_vs_trl.py --out grpo_vs_trl.json                        # default rows, one GPU
    python3 bench/grpo_vs_trl.py --tiny --steps 5                             # the tiny model: checks the harness (CPU too)
    python3 bench/grpo_vs_trl.py --variants trl-bf16+nockpt halo-ep1+compile+nockpt+noreplay --repeats 2

Variants (``sft_variants``: a base and options joined by ``+``):

  trl-bf16            stock ``trl.GRPOTrainer`` on the model built as Halo's ``random_init`` builds it (seed 0), bf16
  halo-ep1            Halo's ``grpo`` method: the run ``halo launch grpo RUN.yaml`` takes (the YAML is written to
                      ``--workdir``), started as ``halo launch`` starts it at one process (its checks, then
                      ``runtime.train``), in the row's process so that it can be timed; the ``hf`` rollout engine
  +nockpt             no gradient checkpointing (both); +liger: ``use_liger_kernel`` (stock; add
                      ``+env.LIGER_FUSED_MOE_AUTOTUNE=0``: autotuning, no step finished in 160 s); +compile: ``compile_layers``
  +noreplay           ``routing_replay: false`` (Halo; on by default)
  +recompileN         with +compile: torch._dynamo's ``recompile_limit`` raised to N in the row's process (a diagnostic:
                      generation through the compiled layers and the replay hooks add cache entries; past the limit,
                      8 by default, a layer call runs eager). Every compiled row reports its dynamo counters and
                      whether its output says the limit was hit.

Workload: the standard benchmark config (random init, bf16, sdpa, aux loss off), random text prompts of exactly
``--prompt`` tokens (the tiny tokenizer, one token a character; checked), ``--generations`` completions each, of
exactly ``--completion`` tokens (``generation_kwargs: {min_new_tokens: --completion}``; counted, not assumed),
``--batch`` completions a step, beta 0, loss ``dapo``, a cheap reward (``reward`` below, by dotted path for Halo).

Timing: a CUDA-synced callback times each optimizer step (step begin to step end: generation, loss forward and
backward, clipping, optimizer step); a CUDA-synced wrapper around the row's outermost
``_generate_and_score_completions`` (generation, rewards, advantages and, for Halo, the old-policy pass that records
the routes) times the generation. The update is the difference. Tokens: prompt + completion tokens of the batch
trained on (its masks' sums). The first ``--warmup`` steps are dropped, the medians of the rest kept. Peak memory:
``max_memory_allocated`` over the update windows and over the generation windows (reset between them), and
the larger of the two, the row's peak.
Each row runs in its own process; rows alternate per repeat, in the order given; ``--budget`` bounds the invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import string
import subprocess
import sys
import time
from pathlib import Path

import torch

from sft_halo_row import halo_command
from sft_variants import parse, row_process
from sft_workload import DEFAULT_CONFIG, HERE, TOKENIZER, prepare, trainer_fields

ENTRY = HERE / "grpo_vs_trl.py"
TINY_CONFIG = TOKENIZER / "config.json"
#: Stock Liger with its fused-MoE autotune on (its default) did not finish a step within 160 s on an H200 (benchmarks-history.md).
# compile_layers with routing replay is refused before start (halo_core/methods/grpo.py check): compiled rows run without it.
DEFAULT_VARIANTS = ["trl-bf16+nockpt", "trl-bf16+nockpt+liger+env.LIGER_FUSED_MOE_AUTOTUNE=0", "halo-ep1+nockpt", "halo-ep1+compile+nockpt+noreplay"]
#: The reward's dotted path for Halo's ``reward_funcs`` (this file, imported by name from the bench folder).
REWARD = "grpo_vs_trl.reward"


def reward(prompts, completions, completion_ids, **kwargs):
    """Cheap and different within a group: the share of a completion's tokens with an even id."""
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    parser.add_argument("--prompt", type=int, default=128, help="tokens of every prompt")
    parser.add_argument("--completion", type=int, default=256, help="tokens of every completion (max_completion_length = min_new_tokens)")
    parser.add_argument("--generations", type=int, default=8, help="num_generations")
    parser.add_argument("--batch", type=int, default=16, help="per_device_train_batch_size: completions a step")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3, help="steps dropped before the medians")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--budget", type=float, default=float("inf"), help="seconds the invocation may take: a row starts only "
                        "with --min-row seconds left and is stopped when they run out")
    parser.add_argument("--min-row", type=float, default=60.0)
    parser.add_argument("--timeout", type=float, default=600, help="seconds a row may take")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the model's config.json (random init)")
    parser.add_argument("--tiny", action="store_true", help="the tiny model and shapes: checks the harness end to end")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/halo-grpo-bench"))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    # What the SFT harness's shared pieces (trainer_fields, halo_command) read.
    parser.set_defaults(packing=False, losses=True, halo_log_every=1, nproc=1, profile=None, memory=False, tree={})
    return parser


def parse_variant(variant: str) -> dict:
    """``sft_variants.parse`` plus ``+noreplay`` and ``+recompileN`` (Halo rows only)."""
    options = variant.split("+")
    limits = [o for o in options if o.startswith("recompile") and o[9:].isdigit()]
    spec = parse("+".join(o for o in options if o != "noreplay" and o not in limits), "grpo")
    spec["replay"], spec["recompile_limit"] = "noreplay" not in options, int(limits[0][9:]) if limits else None
    if not spec["halo"] and (not spec["replay"] or limits):
        raise SystemExit(f"{variant!r}: +noreplay and +recompileN are Halo options")
    if limits and not spec["compile"]:
        raise SystemExit(f"{variant!r}: +recompileN (torch._dynamo's recompile_limit) needs +compile")
    if spec["halo"] and (spec["liger"] or spec["ep"] != 1 or spec["fsdp"] or spec["tf_ep"]):
        raise SystemExit(f"{variant!r}: this harness times halo-ep1 with +compile/+nockpt/+noreplay only")
    return spec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tiny:
        args.config, args.prompt, args.completion, args.generations = TINY_CONFIG, 16, 8, 2
        args.batch = min(args.batch, 4)
    if args.batch % args.generations:
        parser.error("--batch must be a multiple of --generations (whole groups a step)")
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")
    args.seq = args.prompt + args.completion
    for variant in args.variants:
        parse_variant(variant)
    return args


def write_prompts(path: Path, rows: int, tokens: int, seed: int = 0) -> None:
    """Random lowercase text of ``tokens`` characters, each one token of the tiny tokenizer (whose merges join
    ``a``-``t`` and ``i``-``s``: those letters are left out)."""
    draw = random.Random(seed)
    alphabet = "".join(c for c in string.ascii_lowercase if c not in "aits") + " "
    with open(path, "w") as f:
        for _ in range(rows):
            f.write(json.dumps({"prompt": "".join(draw.choice(alphabet) for _ in range(tokens))}) + "\n")


def check_prompts(path: Path, tokenizer_folder: Path, tokens: int) -> None:
    """Every prompt is ``tokens`` tokens as TRL tokenizes a plain-text prompt."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    prompts = [json.loads(line)["prompt"] for line in path.read_text().splitlines()]
    lengths = {len(ids) for ids in tokenizer(text=prompts)["input_ids"]}
    if lengths != {tokens}:
        raise SystemExit(f"prompts tokenize to {sorted(lengths)} tokens, not {tokens}")


def grpo_fields(args) -> dict:
    """The GRPO keys every row shares (over ``sft_workload.trainer_fields``)."""
    return {"num_generations": args.generations, "max_completion_length": args.completion, "generation_kwargs": {"min_new_tokens": args.completion},
            "beta": 0.0, "loss_type": "dapo", "temperature": 1.0, "logging_steps": 1}


def summarise(steps: list[float], generation: list[float], tokens: list[int], warmup: int) -> dict:
    """The medians after ``warmup`` steps: update seconds (step minus its generation), tokens per second of the
    update, generation seconds. One generation a step (steps_per_generation = num_iterations = 1)."""
    if len(generation) != len(steps) or len(tokens) != len(steps):
        raise RuntimeError(f"{len(steps)} steps but {len(generation)} generations and {len(tokens)} token counts")
    kept = range(warmup, len(steps))
    updates = [steps[i] - generation[i] for i in kept]
    return {"update_tokens_per_s": round(statistics.median(tokens[i] / (steps[i] - generation[i]) for i in kept)),
            "update_s": round(statistics.median(updates), 4), "generation_s": round(statistics.median(generation[i] for i in kept), 3),
            "step_s": round(statistics.median(steps[i] for i in kept), 3), "tokens_per_step": sorted(set(tokens[i] for i in kept)),
            "steps_timed": len(kept)}


class Probe:
    """Each step's window, its generation's time and tokens, and the update windows' peak memory."""

    def __init__(self):
        self.steps, self.generation, self.tokens, self.losses = [], [], [], []
        self.generation_peak, self.update_peak = [], []  # max_memory_allocated of each window (reset between them)
        self.gpu = torch.cuda.is_available()

    def sync(self):
        if self.gpu:
            torch.cuda.synchronize()

    def time_generation(self, cls) -> None:
        """Wrap ``cls._generate_and_score_completions`` (the outermost one the row's trainer runs)."""
        original, probe = cls._generate_and_score_completions, self

        def timed(trainer, inputs):
            probe.sync()
            start = time.perf_counter()
            output = original(trainer, inputs)
            probe.sync()
            probe.generation.append(time.perf_counter() - start)
            probe.tokens.append(int(output["prompt_mask"].sum()) + int(output["completion_mask"].sum()))
            if probe.gpu:
                probe.generation_peak.append(torch.cuda.max_memory_allocated())
                torch.cuda.reset_peak_memory_stats()  # the update window's peak from here on
            return output

        cls._generate_and_score_completions = timed

    def callback(self):
        from transformers import TrainerCallback

        probe = self

        class Window(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                probe.sync()
                self.start = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                probe.sync()
                probe.steps.append(time.perf_counter() - self.start)
                if probe.gpu:
                    probe.update_peak.append(torch.cuda.max_memory_allocated())
                    torch.cuda.reset_peak_memory_stats()  # the next generation window's

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "loss" in logs:
                    probe.losses.append(float(logs["loss"]))

        return Window()


def worker(variant: str, args) -> None:
    """One row in this process: train, time, write ``VARIANT.row.json``."""
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    spec, workdir, probe = parse_variant(variant), args.workdir, Probe()
    if spec["recompile_limit"]:
        torch._dynamo.config.recompile_limit = spec["recompile_limit"]
    if spec["halo"]:  # what ``halo launch grpo RUN.yaml`` does at one process, with the probe's callback
        from halo_core.methods.grpo import HaloGRPOConfig, HaloGRPOTrainer
        from halo_core.trainers.run_checks import check_run
        from halo_core.trainers.run_config import check_layout, load_run_config
        from halo_core.trainers.runtime import train

        class Trainer(HaloGRPOTrainer):
            def save_model(self, *a, **k):  # the run's end writes the model: not the bench's business
                pass

        probe.time_generation(Trainer)
        run = load_run_config("grpo", HaloGRPOConfig, workdir / f"{variant}.yaml")
        check_run(run, 1)
        check_layout(run, 1)
        trainer = train(run, Trainer, HaloGRPOConfig, reference=lambda a: a.beta != 0.0, callbacks=[probe.callback()])
    else:
        from trl import GRPOConfig, GRPOTrainer

        probe.time_generation(GRPOTrainer)
        fields = {**trainer_fields(spec, args, workdir / "out" / variant), **grpo_fields(args)}
        for key in ("disable_tqdm", "max_length"):  # not GRPOConfig's
            fields.pop(key)
        if not probe.gpu:
            fields["use_cpu"] = True
        torch.manual_seed(0)  # Halo's random_init: seed, then from_config on the device
        with torch.device("cuda" if probe.gpu else "cpu"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(workdir / "model"), dtype=torch.bfloat16, attn_implementation="sdpa")
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=GRPOConfig(**fields), processing_class=AutoTokenizer.from_pretrained(workdir / "model"),
                              train_dataset=datasets.load_dataset("json", data_files=str(workdir / "data.jsonl"), split="train"), callbacks=[probe.callback()])
        trainer.train()
    row = {**summarise(probe.steps, probe.generation, probe.tokens, args.warmup), "optimizer": type(getattr(trainer.optimizer, "optimizer", trainer.optimizer)).__name__, "losses": probe.losses}
    if spec["compile"]:
        from torch._dynamo.utils import counters

        row["dynamo"] = {key: dict(counters[key]) for key in ("frames", "stats")}
    gib = lambda peaks: round(max(peaks, default=0) / 2**30, 2)  # noqa: E731  (0 on a CPU)
    row.update(update_peak_gib=gib(probe.update_peak), generation_peak_gib=gib(probe.generation_peak), peak_gib=gib(probe.update_peak + probe.generation_peak))
    (workdir / f"{variant}.row.json").write_text(json.dumps(row))


def run_row(variant: str, args, timeout: float) -> dict:
    """One row in its own process (``--worker``); a failure is the row's, not the invocation's."""
    spec = parse_variant(variant)
    if spec["halo"]:  # the run halo launch takes: the shared fields, then GRPO's and Halo's own
        fields = {**grpo_fields(args), "max_length": None, "reward_funcs": [REWARD], "routing_replay": spec["replay"]}
        halo_command(variant, spec, args, args.workdir, "grpo", fields)
    env, _ = row_process(spec, args.tree)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)  # the reward's module
    command = [sys.executable, str(ENTRY), "--worker", variant, "--workdir", str(args.workdir), "--prompt", str(args.prompt),
               "--completion", str(args.completion), "--generations", str(args.generations), "--batch", str(args.batch),
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--lr", str(args.lr), "--config", str(args.config)]
    (args.workdir / f"{variant}.row.json").unlink(missing_ok=True)
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        output = "".join(p.decode(errors="replace") if isinstance(p, bytes) else p or "" for p in (expired.stdout, expired.stderr))
        return {"variant": variant, "error": f"timed out after {timeout:.0f} s; output's end: {output[-2500:]}"}
    wall = round(time.perf_counter() - started, 1)
    if done.returncode:
        return {"variant": variant, "error": (done.stdout + done.stderr)[-3000:], "wall_s": wall}
    row = {"variant": variant, **json.loads((args.workdir / f"{variant}.row.json").read_text()), "wall_s": wall}
    if spec["compile"]:
        row["recompile_limit_hit"] = "hit config.recompile_limit" in done.stdout + done.stderr
    return row


def print_summary(results: list[dict]) -> None:
    rates: dict[str, list[int]] = {}
    for r in results:
        if "update_tokens_per_s" in r:
            rates.setdefault(r["variant"], []).append(r["update_tokens_per_s"])
    stock = max((statistics.median(v) for k, v in rates.items() if not parse_variant(k)["halo"]), default=float("nan"))
    print(f"\n{'variant':34} {'rep':>3} {'update tok/s':>12} {'x stock':>7} {'update s':>8} {'gen s/step':>10} {'upd peak GiB':>12} {'peak GiB':>8}  tokens/step")
    for r in results:
        if "update_tokens_per_s" in r:
            print(f"{r['variant']:34} {r['repeat']:>3} {r['update_tokens_per_s']:>12} {r['update_tokens_per_s'] / stock:>7.2f} {r['update_s']:>8} "
                  f"{r['generation_s']:>10} {r.get('update_peak_gib', 0.0):>12} {r['peak_gib']:>8}  {r['tokens_per_step']}")
    print("x stock: over the fastest stock variant (median of its repeats)")
    for r in results:
        if "error" in r:
            print(f"{r['variant']} (repeat {r['repeat']}): FAILED\n{r['error']}")
        elif "skipped" in r:
            print(f"{r['variant']} (repeat {r['repeat']}): skipped, {r['skipped']}")


def main() -> None:
    args = parse_args()
    if args.worker:
        return worker(args.worker, args)
    started = time.perf_counter()
    args.workdir.mkdir(parents=True, exist_ok=True)
    prompts = args.workdir / "prompts.jsonl"
    write_prompts(prompts, args.steps * args.batch // args.generations + 8, args.prompt)
    prepare(args.workdir, args.config, args.seq, 0, prompts)
    check_prompts(args.workdir / "data.jsonl", args.workdir / "model", args.prompt)
    shape = {"prompt": args.prompt, "completion": args.completion, "generations": args.generations, "batch": args.batch,
             "steps": args.steps, "warmup": args.warmup, "config": str(args.config), "expected_tokens_per_step": args.batch * args.seq}
    print(f"workload: {json.dumps(shape)}", flush=True)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    results = []
    for repeat in range(args.repeats):
        for variant in args.variants:
            left = args.budget - (time.perf_counter() - started)
            if left < args.min_row:
                results.append({"variant": variant, "repeat": repeat, "skipped": f"{left:.0f} s of --budget left"})
                continue
            row = {"repeat": repeat, **run_row(variant, args, min(args.timeout, left))}
            print(json.dumps(row), flush=True)
            results.append(row)
            if args.out:  # after every row, so a run cut short keeps what it measured
                args.out.write_text(json.dumps({"workload": shape, "gpu": gpu, "results": results}, indent=2))
    print_summary(results)


if __name__ == "__main__":
    main()
