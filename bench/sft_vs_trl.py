"""Stock TRL against ``halo launch sft`` on the same model, data and settings, in one invocation (issue 7).

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
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG = HERE / "configs" / "qwen3-moe-3b.config.json"
TOKENIZER = HERE.parent / "templates" / "tiny" / "model"
WARMUP = 5


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
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv, d = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    attention = h * (heads * d) * 2 + h * (kv * d) * 2
    if "num_experts" in config:  # top-k experts and the router
        mlp = config["num_experts_per_tok"] * 3 * h * config["moe_intermediate_size"] + h * config["num_experts"]
    else:
        mlp = 3 * h * config["intermediate_size"]
    active = layers * (attention + mlp) + h * config["vocab_size"]  # lm_head included, embeddings not
    causal_attention = layers * 2 * 2 * heads * d * seq / 2 * 3  # QK^T and PV, causal half, fwd + bwd
    return 6 * active + causal_attention


def parse(variant: str) -> dict:
    base, *options = variant.split("+")
    environment = dict(o[len("env."):].split("=", 1) for o in options if o.startswith("env.") and "=" in o)
    trees = [o[len("tree."):] for o in options if o.startswith("tree.")]
    options = [o for o in options if not (o.startswith("env.") and "=" in o) and not o.startswith("tree.")]
    budgets = [o for o in options if o.startswith("ab") and o[2:].isdigit()]
    units = [o for o in options if o.startswith("unit") and o[4:].isdigit()]
    options = [o for o in options if o not in budgets + units]
    known = {"liger", "liger-moe", "nockpt", "fsdp", "compile", "tf-ep", "kahan", "replicated"}
    if budgets and "compile" not in options:
        raise SystemExit(f"{variant!r}: +abNN (activation memory budget) needs +compile")
    if set(options) - known or "" in trees or len(trees) > 1 or not (base in ("trl-fp32-autocast", "trl-bf16") or (base.startswith("halo-ep") and base[7:].isdigit())):
        raise SystemExit(f"unknown variant {variant!r}: see --help")
    if ({"liger-moe", "compile", "kahan", "replicated"} & set(options) or units or trees) and not base.startswith("halo"):
        raise SystemExit(f"{variant!r}: +liger-moe, +compile, +kahan, +replicated, +unitN and +tree.NAME are Halo options")
    if units and "replicated" in options:
        raise SystemExit(f"{variant!r}: +unitN groups FSDP units, which +replicated has none of")
    if "tf-ep" in options and (base.startswith("halo") or "fsdp" in options):
        raise SystemExit(f"{variant!r}: +tf-ep is a stock-TRL option (it brings its own FSDP2)")
    return {
        "halo": base.startswith("halo"), "ep": int(base[7:]) if base.startswith("halo") else 1,
        "fp32_weights": base == "trl-fp32-autocast", "liger": "liger" in options or "liger-moe" in options,
        "liger_moe": "liger-moe" in options, "checkpointing": "nockpt" not in options, "fsdp": "fsdp" in options,
        "compile": "compile" in options, "tf_ep": "tf-ep" in options, "kahan": "kahan" in options, "activation_budget": int(budgets[0][2:]) / 100 if budgets else None,
        "unit_layers": int(units[0][4:]) if units else None, "replicated": "replicated" in options,
        "environment": environment, "tree": trees[0] if trees else None,
    }


def row_process(spec: dict, trees: dict[str, Path]) -> tuple[dict, Path | None]:
    """The environment and working directory of a row's processes. A ``+tree.NAME`` row starts in that
    checkout with it first on the path: ``python -m`` puts the working directory ahead of everything,
    so the checkout's halo_core is imported, not the installed one."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **spec["environment"]}
    if spec["tree"] is None:
        return env, None
    if spec["tree"] not in trees:
        raise SystemExit(f"+tree.{spec['tree']}: no checkout of that name; add --tree {spec['tree']}=DIR")
    tree = trees[spec["tree"]].resolve()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH", "")) if p)
    return env, tree


def prepare(workdir: Path, config: Path, seq: int, rows: int, dataset: Path | None) -> None:
    """A model folder (the benchmark config and the tiny tokenizer) and the data: ``dataset``, or random token rows."""
    model = workdir / "model"
    model.mkdir(parents=True, exist_ok=True)
    shutil.copy(config, model / "config.json")
    for name in os.listdir(TOKENIZER):
        if name.startswith("tokenizer") or name in ("special_tokens_map.json", "chat_template.jinja"):
            shutil.copy(TOKENIZER / name, model / name)
    if dataset is not None:
        shutil.copy(dataset, workdir / "data.jsonl")
        return
    vocab = json.loads(config.read_text())["vocab_size"]
    generator = torch.Generator().manual_seed(0)
    with open(workdir / "data.jsonl", "w") as f:
        for _ in range(rows):
            f.write(json.dumps({"input_ids": torch.randint(0, vocab, (seq,), generator=generator).tolist()}) + "\n")


def trainer_fields(spec: dict, args, output_dir: Path) -> dict:
    fields = {
        "output_dir": str(output_dir), "max_steps": args.steps, "per_device_train_batch_size": args.batch,
        "gradient_checkpointing": spec["checkpointing"], "bf16": True, "learning_rate": args.lr, "logging_steps": 1,
        "save_strategy": "no", "report_to": "none", "max_length": args.seq, "router_aux_loss_coef": 0.0,
        "dataloader_num_workers": 0, "disable_tqdm": True, "seed": 0,
    }
    if spec["liger"]:
        fields["use_liger_kernel"] = True
    if args.packing:
        fields["packing"] = True
    if spec["fsdp"]:
        fields["fsdp"] = "full_shard"
        fields["fsdp_config"] = {"fsdp_version": 2, "transformer_layer_cls_to_wrap": ["Qwen3MoeDecoderLayer"]}
    return fields


# -- one variant, in the processes the orchestrator starts ----------------------------------------


def halo_command(variant: str, spec: dict, args, workdir: Path) -> list[str]:
    import yaml

    run = {
        "model_name_or_path": str(workdir / "model"), "random_init": True, "dataset": [{"path": str(workdir / "data.jsonl")}],
        "expert_parallel_size": spec["ep"], **trainer_fields(spec, args, workdir / "out" / variant),
        "logging_steps": 1 if args.losses else args.halo_log_every,
    }
    if spec["liger_moe"]:
        run["experts_implementation"] = "liger_moe"
    if spec["compile"]:
        run["compile_layers"] = True
    if spec["activation_budget"] is not None:
        run["activation_memory_budget"] = spec["activation_budget"]
    if spec["kahan"]:
        run["adamw_bf16_kahan"] = True
    if spec["unit_layers"]:
        run["fsdp_unit_layers"] = spec["unit_layers"]
    if spec["replicated"]:
        run["shard_parameters"] = False
    path = workdir / f"{variant}.yaml"
    path.write_text(yaml.safe_dump(run))
    return [sys.executable, "-m", "halo_cli", "launch", "sft", str(path), "--nproc", str(args.nproc)]


def halo_result(output: str, seq: int, batch: int, every: int) -> dict:
    """The median over the logs after warm-up of the trainer's tokens/s, each the average of ``every`` steps."""
    logs = [ast.literal_eval(line) for line in output.splitlines() if line.startswith("{") and "tokens_per_second_per_device" in line]
    skip = -(-WARMUP // every)  # logs covering a warm-up step
    if len(logs) <= skip:
        raise RuntimeError(f"expected a log every {every} steps, got {len(logs)}:\n{output[-3000:]}")
    rates = [float(log["tokens_per_second_per_device"]) for log in logs[skip:]]
    rate = statistics.median(rates)
    return {"tokens_per_s": round(rate), "median_step_s": round(seq * batch / rate, 4), "steps_timed": len(rates) * every,
            "peak_gib": max(float(log["peak_memory_gib_per_device"]) for log in logs),
            "losses": [float(log["loss"]) for log in logs]}


def saved_model(workdir: Path, config, dtype: torch.dtype) -> Path:
    """The random initialisation on disk (``from_pretrained`` is where transformers applies a DistributedConfig).
    The orchestrator writes it before the ranks start, so they all read the same weights."""
    folder = workdir / f"saved-{str(dtype).removeprefix('torch.')}"
    if not (folder / "config.json").exists():
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.save_pretrained(folder)
        del model
        torch.cuda.empty_cache()
    return folder


def trl_worker(variant: str, args, workdir: Path) -> None:
    """Stock TRL (or, for --profile, Halo's trainer in-process): train, time each step, write the row."""
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    spec = parse(variant)
    rank = int(os.environ.get("RANK", "0"))
    if "LOCAL_RANK" in os.environ:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    config = AutoConfig.from_pretrained(workdir / "model")
    data = datasets.load_dataset("json", data_files=str(workdir / "data.jsonl"), split="train")
    torch.manual_seed(0)
    extra = {}
    if spec["liger_moe"]:  # the profile of a Halo +liger-moe row: the same experts implementation as its YAML asks for
        from halo_core.kernels import liger

        liger.register()
        extra["experts_implementation"] = liger.EXPERTS_IMPLEMENTATION
    dtype = torch.float32 if spec["fp32_weights"] else torch.bfloat16
    if spec["tf_ep"]:  # the peer: transformers' own expert parallelism over every rank, FSDP2 over the rest, stock trainer
        import inspect

        import transformers
        from transformers.distributed import DistributedConfig

        if "ep_size" not in inspect.signature(DistributedConfig).parameters:
            raise SystemExit(f"+tf-ep: transformers {transformers.__version__} has no DistributedConfig(ep_size=...) (5.23 has)")
        world = int(os.environ.get("WORLD_SIZE", "1"))
        model = AutoModelForCausalLM.from_pretrained(
            saved_model(workdir, config, dtype), dtype=dtype, attn_implementation="sdpa",
            distributed_config=DistributedConfig(ep_size=world, fsdp_size=world, ep_implementation="all_to_all"),
        )
    else:
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa", **extra)

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.last, self.profiler, self.losses = [], None, None, []

        def on_log(self, args_, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))

        def on_step_begin(self, args_, state, control, **kwargs):
            torch.cuda.synchronize()
            self.last = time.perf_counter()
            if args.memory and state.global_step == WARMUP + 3:  # after the profiled steps: one step's allocator history
                torch.cuda.reset_peak_memory_stats()
                self.baseline = torch.cuda.memory_allocated()
                torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="all")
            if args.profile and state.global_step == WARMUP:
                self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
                self.profiler.__enter__()

        def on_step_end(self, args_, state, control, **kwargs):
            torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self.last)
            if args.memory and state.global_step == WARMUP + 4:
                from memory_peak import peak_breakdown

                snapshot = torch.cuda.memory._snapshot()
                torch.cuda.memory._record_memory_history(enabled=None)
                report = peak_breakdown(snapshot["device_traces"][torch.cuda.current_device()], self.baseline)
                (workdir / f"memory-{variant}-rank{rank}.txt").write_text(
                    f"max_memory_allocated over the step: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB\n{report}\n")
            if self.profiler is not None and state.global_step == WARMUP + 2:
                self.profiler.__exit__(None, None, None)
                averages = self.profiler.key_averages()
                # Kernels only: not the ops that launched them, nor GPU-side annotations such as Optimizer.step
                kernels = [e for e in averages if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
                           and not e.key.startswith(("Optimizer.", "ProfilerStep"))]
                gpu_ms = sum(e.self_device_time_total for e in kernels) / 1e3 / 2
                cpu_ms = sum(e.self_cpu_time_total for e in averages) / 1e3 / 2
                wall_ms = sum(self.times[-2:]) * 1e3 / 2
                summary = f"per step: {gpu_ms:.1f} ms of GPU kernels, {cpu_ms:.1f} ms of CPU in ops, {wall_ms:.1f} ms wall (profiler on)\n"
                table = averages.table(sort_by="self_cuda_time_total", row_limit=60, max_name_column_width=90)
                by_cpu = averages.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=90)
                (workdir / f"profile-{variant}.txt").write_text(summary + table + "\nBy CPU time:\n" + by_cpu)
                self.profiler.export_chrome_trace(str(workdir / f"trace-rank{rank}.json"))  # the timeline: what overlaps, where the GPU idles
                self.profiler = None

    timer = StepTimer()
    fields = trainer_fields(spec, args, workdir / "out" / variant)
    fields.pop("disable_tqdm")
    sft_args = SFTConfig(**{**fields, "logging_steps": 1 if args.losses else 1000})  # logging costs TRL time: only when asked
    if spec["halo"]:
        from halo_core import ParallelConfig
        from halo_core.trainers.sft import HaloSFTTrainer

        trainer = HaloSFTTrainer(model=model, args=sft_args, train_dataset=data, processing_class=AutoTokenizer.from_pretrained(workdir / "model"),
                                 callbacks=[timer], parallel_config=ParallelConfig(ep=spec["ep"], fsdp_unit_layers=spec["unit_layers"] or 1, fsdp=not spec["replicated"]), compile_layers=spec["compile"],
                                 activation_memory_budget=spec["activation_budget"], adamw_bf16_kahan=spec["kahan"])
    else:
        trainer = SFTTrainer(model=model, args=sft_args, train_dataset=data, processing_class=AutoTokenizer.from_pretrained(workdir / "model"), callbacks=[timer])
    trainer.train()
    if rank == 0:
        step = statistics.median(timer.times[WARMUP:])
        row = {"tokens_per_s": round(args.seq * args.batch / step), "median_step_s": round(step, 4), "steps_timed": len(timer.times[WARMUP:]),
               "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2), "optimizer": type(trainer.optimizer).__name__, "losses": timer.losses}
        (workdir / f"{variant}.row.json").write_text(json.dumps(row))


# -- the orchestrator ------------------------------------------------------------------------------


def run_variant(variant: str, args, workdir: Path) -> dict:
    spec = parse(variant)
    if spec["tf_ep"]:
        from transformers import AutoConfig

        saved_model(workdir, AutoConfig.from_pretrained(workdir / "model"), torch.float32 if spec["fp32_weights"] else torch.bfloat16)
    env, cwd = row_process(spec, args.tree)
    if spec["halo"] and not args.profile:
        command = halo_command(variant, spec, args, workdir)
    else:
        script = [str(Path(__file__).resolve()), "--worker", variant, "--workdir", str(workdir), "--seq", str(args.seq),
                  "--steps", str(args.steps), "--batch", str(args.batch), "--lr", str(args.lr)]
        script += (["--profile", variant] if args.profile else []) + (["--memory"] if args.memory else []) + (["--losses"] if args.losses else []) + (["--packing"] if args.packing else [])
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}"] if args.nproc > 1 else [sys.executable]
        command = launcher + script
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=args.timeout)
    if done.returncode:
        return {"variant": variant, "error": (done.stdout + done.stderr)[-2500:]}
    if spec["halo"] and not args.profile:
        row = halo_result(done.stdout, args.seq, args.batch, 1 if args.losses else args.halo_log_every)
    else:
        row = json.loads((workdir / f"{variant}.row.json").read_text())
    return {"variant": variant, **row, "wall_s": round(time.perf_counter() - started, 1)}


def check_compiled_layers(config_path: Path, device: str = "cuda") -> dict:
    """GPU equivalence of ``compile_layers``: a one-layer model of the benchmark config, eager against
    compiled (with the activation budget the fastest row uses), same weights and tokens, bf16."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from halo_core import ParallelConfig, parallelize
    from halo_core.trainers.parts.compile import compile_decoder_layers

    config = AutoConfig.from_pretrained(config_path)
    config.num_hidden_layers = 1
    torch.manual_seed(0)
    with torch.device(device):
        eager = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
        compiled = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    compiled.load_state_dict(eager.state_dict())
    compile_decoder_layers(parallelize(compiled, ParallelConfig()), activation_memory_budget=0.5)
    ids = torch.randint(0, config.vocab_size, (1, 4096 if device == "cuda" else 64), device=device)
    losses = [model(input_ids=ids, labels=ids).loss for model in (eager, compiled)]
    for loss in losses:
        loss.backward()
    error = lambda a, b: float((a.float() - b.float()).norm() / b.float().norm())  # noqa: E731
    grads = {name: error(b.grad, a.grad) for (name, a), b in zip(eager.named_parameters(), compiled.parameters())
             if a.grad is not None and ("layers.0" in name or "lm_head" in name)}
    worst = max(grads, key=grads.get)
    del eager, compiled
    if device == "cuda":
        torch.cuda.empty_cache()
    loss_error = error(losses[1].detach(), losses[0].detach())
    if loss_error > 1e-2:  # bf16 rounding differs by far less; anything near this is a wrong compilation
        raise SystemExit(f"compiled layers disagree with eager ones: loss relative error {loss_error:.3g}")
    return {"compiled_vs_eager": {"loss": loss_error, "worst_gradient": worst, "its_error": grads[worst]}}


def check_kernels(config_path: Path) -> dict:
    """GPU equivalence of the kernels Halo can switch on, against transformers' own path, on this GPU."""
    from transformers import AutoConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    from halo_core.kernels import liger

    liger.register()
    config = AutoConfig.from_pretrained(config_path)
    torch.manual_seed(0)
    experts = Qwen3MoeExperts(config).cuda().to(torch.bfloat16)
    torch.nn.init.normal_(experts.gate_up_proj, std=0.02)
    torch.nn.init.normal_(experts.down_proj, std=0.02)
    tokens = torch.randn(4096, config.hidden_size, device="cuda", dtype=torch.bfloat16)
    index = torch.randn(4096, config.num_experts, device="cuda").topk(config.num_experts_per_tok).indices
    weights = torch.rand(4096, config.num_experts_per_tok, device="cuda", dtype=torch.bfloat16)
    results = {}
    for name in ("grouped_mm", liger.EXPERTS_IMPLEMENTATION):
        experts.config._experts_implementation = name
        x = tokens.clone().requires_grad_()
        out = experts(x, index, weights)
        out.float().square().sum().backward()
        results[name] = (out.detach().float(), x.grad.float(), experts.gate_up_proj.grad.float())
        experts.zero_grad()
    error = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    reference, fused = results["grouped_mm"], results[liger.EXPERTS_IMPLEMENTATION]
    return {"liger_moe_vs_grouped_mm": {"output": error(fused[0], reference[0]), "input_grad": error(fused[1], reference[1]), "gate_up_grad": error(fused[2], reference[2])}}


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
    checks = check_kernels(args.config) if any("liger-moe" in v for v in args.variants) and not args.profile else {}
    if any("compile" in v for v in args.variants) and not args.profile:
        checks.update(check_compiled_layers(args.config))
    if checks:
        print(f"kernel checks (relative error, bf16): {json.dumps(checks)}", flush=True)
    variants = [args.profile] if args.profile else args.variants
    results = []
    for repeat in range(args.repeats):
        for variant in variants:
            row = {"repeat": repeat, "nproc": args.nproc, "seq": args.seq, "batch": args.batch, **run_variant(variant, args, args.workdir)}
            if "tokens_per_s" in row:
                row["mfu"] = round(flops_per_token(config, args.seq) * row["tokens_per_s"] / rate, 4)
            print(json.dumps(row), flush=True)
            results.append(row)
            if args.out:  # after every row, so a run cut short keeps what it measured
                args.out.write_text(json.dumps({"matmul_tflops": rate / 1e12, "kernel_checks": checks, "results": results}, indent=2))
    ok = [r for r in results if "tokens_per_s" in r]
    best = {}
    for r in ok:
        best.setdefault(r["variant"], []).append(r["tokens_per_s"])
    base = {v: statistics.median(t) for v, t in best.items()}
    print(f"\n{'variant':28} {'tokens/s/GPU':>12} {'peak GiB':>9} {'MFU':>6} {'x fp32':>7} {'x bf16':>7}")
    for r in ok:
        ratios = [r["tokens_per_s"] / base[k] if k in base else float("nan") for k in ("trl-fp32-autocast", "trl-bf16")]
        print(f"{r['variant']:28} {r['tokens_per_s']:>12} {r['peak_gib']:>9} {r['mfu']:>6.3f} {ratios[0]:>7.2f} {ratios[1]:>7.2f}")
    for r in results:
        if "error" in r:
            print(f"{r['variant']}: FAILED\n{r['error']}")
    if args.profile and (args.workdir / f"profile-{args.profile}.txt").exists():
        print((args.workdir / f"profile-{args.profile}.txt").read_text())
    for report in sorted(args.workdir.glob(f"memory-{args.profile}-rank*.txt")) if args.profile else []:
        print(f"{report.name}:\n{report.read_text()}")


if __name__ == "__main__":
    main()
