"""The in-process row of ``sft_vs_trl.py``: stock TRL, or for ``--profile`` Halo's trainer, timed per step.

It runs in the processes the orchestrator starts (``sft_vs_trl.py --worker``), so each row has a
fresh CUDA context. A callback times each optimizer step after a CUDA sync, and for
``--profile``/``--memory`` records steps 6-7 and one step's allocator history.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch

from sft_variants import parse
from sft_workload import WARMUP, saved_model, trainer_fields


def trl_worker(variant: str, args, workdir: Path) -> None:
    """Stock TRL (or, for --profile, Halo's trainer in-process): train, time each step, write the row."""
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
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

    timer = step_timer(variant, args, workdir, rank)
    fields = trainer_fields(spec, args, workdir / "out" / variant)
    fields.pop("disable_tqdm")
    sft_args = SFTConfig(**{**fields, "logging_steps": 1 if args.losses else 1000})  # logging costs TRL time: only when asked
    if spec["halo"]:
        from halo_core import ParallelConfig
        from halo_core.methods.sft import HaloSFTTrainer

        trainer = HaloSFTTrainer(model=model, args=sft_args, train_dataset=data, processing_class=AutoTokenizer.from_pretrained(workdir / "model"),
                                 callbacks=[timer], parallel_config=ParallelConfig(ep=spec["ep"], fsdp_unit_layers=spec["unit_layers"] or 1, fsdp=not spec["replicated"]), compile_layers=spec["compile"],
                                 activation_memory_budget=spec["activation_budget"], adamw_bf16_kahan=spec["kahan"])
    else:
        trainer = SFTTrainer(model=model, args=sft_args, train_dataset=data, processing_class=AutoTokenizer.from_pretrained(workdir / "model"), callbacks=[timer])
    trainer.train()
    if rank == 0:
        write_row(variant, timer, trainer, args.seq * args.batch, workdir)


def step_timer(variant: str, args, workdir: Path, rank: int):
    """A callback that times each optimizer step after a CUDA sync and keeps the logged losses; with
    ``args.profile``/``args.memory`` it also records steps 6-7 and one step's allocator history."""
    from transformers import TrainerCallback

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)  # a CPU dry run of the harness times too

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.last, self.profiler, self.losses = [], None, None, []

        def on_log(self, args_, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))

        def on_step_begin(self, args_, state, control, **kwargs):
            sync()
            self.last = time.perf_counter()
            if args.memory and state.global_step == WARMUP + 3:  # after the profiled steps: one step's allocator history
                torch.cuda.reset_peak_memory_stats()
                self.baseline = torch.cuda.memory_allocated()
                torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="all")
            if args.profile and state.global_step == WARMUP:
                self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
                self.profiler.__enter__()

        def on_step_end(self, args_, state, control, **kwargs):
            sync()
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

    return StepTimer()


def write_row(variant: str, timer, trainer, tokens_per_step: int, workdir: Path) -> None:
    """The row the orchestrator reads back: the median of the timed steps after warm-up."""
    step = statistics.median(timer.times[WARMUP:])
    row = {"tokens_per_s": round(tokens_per_step / step), "median_step_s": round(step, 4), "steps_timed": len(timer.times[WARMUP:]),
           "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else 0.0, "optimizer": type(trainer.optimizer).__name__, "losses": timer.losses}
    (workdir / f"{variant}.row.json").write_text(json.dumps(row))
