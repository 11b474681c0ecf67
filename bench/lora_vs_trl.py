"""LoRA on the MoE: ``halo launch sft`` with TRL's LoRA keys against Halo full fine-tuning and stock TRL + PEFT.

    python3 bench/lora_vs_trl.py --out lora.json                            # the default rows, one GPU
    python3 bench/lora_vs_trl.py --rows halo-lora+compile+nockpt+ab50 trl-peft+nockpt --repeats 2
    python3 bench/lora_vs_trl.py --config templates/tiny/model/config.json --seq 64 --steps 8 --halo-log-every 1 \\
        --rows halo-full+nockpt halo-lora+nockpt trl-peft+nockpt            # the CPU dry run: checks the harness only

A row is a kind and ``sft_vs_trl.py``'s options (``sft_variants``: ``+compile``, ``+abNN``, ``+nockpt``, ``+liger``, ...):

  halo-full   ``halo launch sft``, every weight trained (bf16 weights, AdamWBF16): the variant ``halo-ep1+OPTIONS``
  halo-lora   the same run with TRL's ``ModelConfig`` LoRA keys in its YAML (``LORA``): stock PEFT's adapters on
              the attention projections, Halo's grouped LoRA on the fused experts (``halo_core.lora``)
  halo-lora-attn  a diagnosis: halo-lora without the fused expert targets (adapters on the attention projections
              only, so the experts keep transformers' grouped_mm); not a target row
  trl-peft    stock ``trl.SFTTrainer(peft_config=get_peft_config(ModelConfig(**LORA)))`` on the bf16 model
              (the variant ``trl-bf16+OPTIONS``): PEFT reaches the fused experts through ``target_parameters``,
              adapters in fp32 (PEFT's ``autocast_adapter_dtype``), torch AdamW. Without ``+nockpt`` TRL's
              default gradient checkpointing is on, so ``trl-peft`` alone is the default-settings row

Every LoRA row has the same targets, rank and alpha (``LORA``). Each row runs in its own process, in the
order given, the whole list ``--repeats`` times. Workload as in ``sft_vs_trl.py``: the benchmark config,
random init at seed 0 (Halo's ``random_init`` draws the same weights), random rows of exactly ``--seq``
tokens, batch 1, sdpa, aux loss off; ``--steps`` steps, the first 5 dropped, the median kept. Halo rows report
the trainer's logged tokens/s, log to log over ``--halo-log-every`` steps; stock rows time each step
(CUDA-synced callback). Every row also logs its first step (``logging_first_step``): before any update
the adapters add nothing, so every row's step-1 loss is the same model's on the same row. Peak memory is
``max_memory_allocated``. MFU counts 6 x active parameters per token for full fine-tuning and 4 x for
LoRA (no weight gradients of the frozen base), plus attention, over the matmul rate measured at the start.

Before the rows (on the GPU and the CPU alike) ``check_lora_against_peft`` compares Halo's adapters with
stock PEFT's on a one-layer model of the config: the same initial values, then, with nonzero adapters,
the same loss and adapter gradients.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import math
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from sft_checks import start_measuring
from sft_halo_row import halo_command, halo_result, unwrapped
from sft_report import flops_per_token, print_reports, write
from sft_rows import run_variant
from sft_trl_row import step_timer, write_row
from sft_variants import parse, row_process
from sft_workload import DEFAULT_CONFIG, HERE, prepare, trainer_fields

ENTRY = HERE / "lora_vs_trl.py"
STARTED = time.perf_counter()

#: TRL ``ModelConfig`` fields every LoRA row trains with (issue 23): the attention projections and the fused experts.
LORA = {
    "use_peft": True, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
    "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "lora_target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
}
#: Each kind's ``sft_variants`` base.
KINDS = {"halo-full": "halo-ep1", "halo-lora": "halo-ep1", "halo-lora-attn": "halo-ep1", "trl-peft": "trl-bf16"}
DEFAULT_ROWS = ["halo-full+compile+nockpt+ab50", "trl-peft+nockpt", "halo-lora+compile+nockpt+ab50", "trl-peft+nockpt+liger", "trl-peft"]
#: The issue's targets: LoRA tokens/s over Halo full fine-tuning's, its peak memory over full's, its tokens/s over stock's.
TARGETS = {"lora_over_full_speed": 1.25, "lora_over_full_memory": 0.5, "lora_over_stock_speed": 2.0}


def resolve(row: str) -> tuple[str, str, dict]:
    """A row's kind, its ``sft_variants`` name and settings; a row that cannot run here is refused before any runs."""
    kind, plus, options = row.partition("+")
    if kind not in KINDS:
        raise SystemExit(f"row {row!r}: a row is KIND[+OPTIONS], KIND one of {', '.join(KINDS)}")
    variant = KINDS[kind] + plus + options
    spec = parse(variant)
    if spec["fsdp"] or spec["tf_ep"]:
        raise SystemExit(f"row {row!r}: this harness runs on one GPU (no +fsdp, +tf-ep)")
    if kind.startswith("halo-lora") and spec["liger_moe"]:
        raise SystemExit(f"row {row!r}: LoRA on fused experts runs in the grouped GEMM, not Liger's fused MoE (drop +liger-moe)")
    return kind, variant, spec


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", default=DEFAULT_ROWS, metavar="KIND+OPTIONS")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=300, help="seconds a row may take (a row past it is recorded as failed)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the model's config.json (random init)")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--halo-log-every", type=int, default=5, help="every row's logging_steps (Halo's throughput is log to log)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/halo-lora-bench"))
    parser.add_argument("--budget", type=float, help="seconds for the whole invocation: a row that would likely end past it is skipped "
                        "(recorded as such), so a lease's last rows give way rather than cut the run short")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)  # run_variant passes it to the worker
    parser.set_defaults(nproc=1, packing=False, profile=None, memory=False, losses=False, tree={})
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if not args.worker:
        args.plan = [(row, *resolve(row)) for row in args.rows]
        for _, _, _, spec in args.plan:
            row_process(spec, args.tree)
    return args


# -- the rows ------------------------------------------------------------------------------------


def lora_fields(kind: str) -> dict:
    """A Halo row's keys over the shared ones: every row logs its first step; halo-lora adds ``LORA``, halo-lora-attn
    ``LORA`` without its fused expert targets (a key set to None is left out of the YAML)."""
    fields = {"logging_first_step": True}
    if kind.startswith("halo-lora"):
        fields.update(copy.deepcopy(LORA))
    if kind == "halo-lora-attn":
        fields["lora_target_parameters"] = None
    return fields


def halo_logs_result(output: str, seq: int, batch: int, every: int) -> dict:
    """``halo_result`` over the logs after the step-1 log (``logging_first_step``), plus that step's loss first."""
    lines = unwrapped(output).splitlines()
    logs = [i for i, line in enumerate(lines) if line.startswith("{") and "tokens_per_second_per_device" in line]
    if not logs:
        raise RuntimeError(f"no trainer log in the output:\n{output[-3000:]}")
    first = logs[0]
    first_loss = float(ast.literal_eval(lines[first])["loss"])
    rest = lines if every == 1 else lines[:first] + lines[first + 1:]  # at every step the first log is a window of its own
    row = halo_result("\n".join(rest), seq, batch, every)
    timed = [ast.literal_eval(line) for line in rest if line.startswith("{") and "tokens_per_second_per_device" in line]
    row["window_rates"] = [round(float(log["tokens_per_second_per_device"])) for log in timed[-(row["steps_timed"] // every):]]
    row["losses"] = row["losses"] if every == 1 else [first_loss] + row["losses"]
    return row


def run_halo(row: str, kind: str, spec: dict, args, workdir: Path) -> dict:
    """A Halo row: ``halo launch sft`` over the YAML ``halo_command`` writes (a timeout is the row's error, as in ``run_variant``)."""
    command = halo_command(row, spec, args, workdir, "sft", lora_fields(kind))
    env, cwd = row_process(spec, args.tree)
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=args.timeout)
    except subprocess.TimeoutExpired as expired:
        output = "".join(part.decode(errors="replace") if isinstance(part, bytes) else part or "" for part in (expired.stdout, expired.stderr))
        return {"variant": row, "error": f"timed out after {args.timeout} s; output's end: {output[-2000:]}"}
    if done.returncode:
        return {"variant": row, "error": (done.stdout + done.stderr)[-2500:]}
    result = halo_logs_result(done.stdout, args.seq, args.batch, args.halo_log_every)
    if kind.startswith("halo-lora"):
        result.update(adapter_trained(workdir / "out" / row / "adapter_model.safetensors"))
    return {"variant": row, **result, "wall_s": round(time.perf_counter() - started, 1)}


def adapter_trained(path: Path) -> dict:
    """How many of a saved adapter's ``lora_B`` tensors moved off their zero start, and its parameter count."""
    from safetensors import safe_open

    if not path.exists():
        return {"adapter_file": f"missing: {path}"}
    with safe_open(str(path), "pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    b = [t for key, t in tensors.items() if "lora_B" in key]
    return {"trainable_params": sum(t.numel() for t in tensors.values()), "lora_B_nonzero": sum(bool(t.any()) for t in b), "lora_B_total": len(b)}


def run_row(row: str, kind: str, variant: str, spec: dict, args) -> dict:
    workdir = args.workdir
    if kind == "trl-peft":
        result = run_variant(variant, args, workdir, entry=ENTRY)
        result["variant"] = row
    else:
        result = run_halo(row, kind, spec, args, workdir)
    shutil.rmtree(workdir / "out", ignore_errors=True)  # a full row's checkpoint and a LoRA row's base: 6 GiB each
    return {"kind": kind, "harness_variant": variant, **result}


def peft_worker(variant: str, args, workdir: Path) -> None:
    """A trl-peft row: stock SFTTrainer with PEFT's LoRA from TRL's own ``ModelConfig`` keys; train, time, write the row."""
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import ModelConfig, SFTConfig, SFTTrainer, get_peft_config

    spec = parse(variant)
    gpu = torch.cuda.is_available()
    config = AutoConfig.from_pretrained(workdir / "model")
    data = datasets.load_dataset("json", data_files=str(workdir / "data.jsonl"), split="train")
    torch.manual_seed(0)
    with torch.device("cuda" if gpu else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    timer = step_timer(variant, args, workdir, 0)
    fields = trainer_fields(spec, args, workdir / "out" / variant)
    fields.pop("disable_tqdm")
    fields.update(logging_steps=args.halo_log_every, logging_first_step=True)  # logs follow the timed step (on_step_end first)
    if not gpu:
        fields["use_cpu"] = True
    trainer = SFTTrainer(model=model, args=SFTConfig(**fields), train_dataset=data, processing_class=AutoTokenizer.from_pretrained(workdir / "model"),
                         callbacks=[timer], peft_config=get_peft_config(ModelConfig(**LORA)))
    trainer.train()
    write_row(variant, timer, trainer, args.seq * args.batch, workdir)
    trained = [(n, p) for n, p in trainer.model.named_parameters() if p.requires_grad]
    b = [p for n, p in trained if "lora_B" in n]
    path = workdir / f"{variant}.row.json"
    row = json.loads(path.read_text())
    row.update(trainable_params=sum(p.numel() for _, p in trained), lora_B_nonzero=sum(bool(p.detach().any()) for p in b), lora_B_total=len(b),
               adapter_dtype=str(trained[0][1].dtype).removeprefix("torch."))
    path.write_text(json.dumps(row))


# -- the check before the rows --------------------------------------------------------------------


def adapter_grads(model) -> dict:
    """Halo's adapter gradients under PEFT's keys (``adapter_state`` over the gradients in place of the values)."""
    from halo_core.lora.peft_format import adapter_state

    trained = [p for p in model.parameters() if p.requires_grad]
    values = [p.data for p in trained]
    try:
        for p in trained:
            p.data = p.grad
        return adapter_state(model)
    finally:
        for p, value in zip(trained, values):
            p.data = value


def check_lora_against_peft(config_path: Path, device: str, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Halo's adapters against stock PEFT's on a one-layer model of the config (bf16 unless ``dtype``), same weights and tokens:
    the initial values (``LORA`` from seed 0), then, with the same nonzero adapters in both, loss and adapter gradients."""
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl import ModelConfig, get_peft_config

    from halo_core import ParallelConfig
    from halo_core.lora.inject import add_adapters
    from halo_core.lora.peft_format import ADAPTER_WEIGHTS, adapter_state, load_adapter
    from halo_core.trainers.parts.layout import lay_out

    config = AutoConfig.from_pretrained(config_path)
    config.num_hidden_layers = 1
    lora = get_peft_config(ModelConfig(**LORA))
    torch.manual_seed(0)
    with torch.device(device):  # (Halo switches its model's experts implementation, which lives on the config)
        stock = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
        halo = AutoModelForCausalLM.from_config(copy.deepcopy(config), dtype=dtype, attn_implementation="sdpa")  # its own
    halo.load_state_dict(stock.state_dict())
    torch.manual_seed(0)
    stock = get_peft_model(stock, copy.deepcopy(lora), autocast_adapter_dtype=False)  # adapters in the weights' dtype, as Halo's
    halo = lay_out(halo, ParallelConfig())
    add_adapters(halo, copy.deepcopy(lora), seed=0)
    initial = {k: v.float() for k, v in adapter_state(halo).items()}
    stock_initial = {k: v.float().cpu() for k, v in get_peft_model_state_dict(stock).items()}
    if set(initial) != set(stock_initial) or any(initial[k].shape != stock_initial[k].shape for k in initial):
        raise SystemExit(f"Halo's adapter keys/shapes differ from PEFT's: {sorted(set(initial) ^ set(stock_initial))[:6]}")
    init_diff = max(float((initial[k] - stock_initial[k]).abs().max()) for k in initial)
    ids = torch.randint(0, config.vocab_size, (1, 4096 if device == "cuda" else 64), device=device, generator=torch.Generator(device).manual_seed(0))
    with torch.no_grad():
        base_loss = float(stock(input_ids=ids, labels=ids).loss)  # the adapters start at B = 0: the base's loss
    generator = torch.Generator().manual_seed(1)  # nonzero adapters (B starts at zero), the same in both
    state = {k: (torch.randn(v.shape, generator=generator) * (0.2 if "lora_B" in k else 1 / math.sqrt(v.shape[-1]))).to(dtype)
             for k, v in initial.items()}
    set_peft_model_state_dict(stock, {k: v.to(device) for k, v in state.items()})
    with tempfile.TemporaryDirectory() as folder:
        save_file(state, str(Path(folder) / ADAPTER_WEIGHTS))
        load_adapter(halo, folder)
    losses = []
    for model in (stock, halo):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.detach().float())
    error = lambda a, b: float((a.float().cpu() - b.float().cpu()).norm() / b.float().cpu().norm().clamp_min(1e-30))  # noqa: E731
    stock_grads = {n.replace(".default.", "."): p.grad for n, p in stock.named_parameters() if p.requires_grad}
    grads = {k: error(g, stock_grads[k]) for k, g in adapter_grads(halo).items()}
    worst = max(grads, key=grads.get)
    result = {"adapters": len(initial), "trainable_params_one_layer": sum(v.numel() for v in initial.values()),
              "initial_max_abs_diff": init_diff, "adapters_shift_loss": abs(float(losses[0]) - base_loss) / base_loss, "loss": error(losses[1], losses[0]), "worst_gradient": worst, "its_error": grads[worst]}
    result["agree"] = init_diff == 0.0 and result["loss"] < 1e-2 and result["its_error"] < 5e-2  # bf16 rounding stays far below
    del stock, halo
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"lora_vs_peft": result}


# -- the figures ---------------------------------------------------------------------------------


def flops_per_trained_token(kind: str, config: dict, seq: int) -> float:
    """``flops_per_token`` (6 x active + attention) for full fine-tuning; LoRA's backward computes no weight
    gradient of the frozen base, so 4 x active (the adapters' own FLOPs are under 1% and left out)."""
    total = flops_per_token(config, seq)
    if kind == "halo-full":
        return total
    active = flops_per_token(config, 0) / 6
    return total - 2 * active


def with_lora_mfu(row: dict, config: dict, rate: float) -> dict:
    if "tokens_per_s" in row:
        row["mfu"] = round(flops_per_trained_token(row["kind"], config, row["seq"]) * row["tokens_per_s"] / rate, 4)
    return row


def medians(results: list[dict]) -> dict[str, dict]:
    """Per row name over its repeats: median tokens/s, the largest peak, and the kind."""
    seen: dict[str, list[dict]] = {}
    for r in results:
        if "tokens_per_s" in r:
            seen.setdefault(r["variant"], []).append(r)
    return {name: {"kind": rows[0]["kind"], "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
                   "peak_gib": max(r["peak_gib"] for r in rows)} for name, rows in seen.items()}


def verdict(results: list[dict]) -> dict:
    """The issue's three ratios (``TARGETS``) for each halo-lora row (medians over repeats) against the fastest
    halo-full row and the fastest trl-peft row; the headline is the first halo-lora row run. Also the step-1
    losses (before any update every row computes the same model's loss) and whether every logged loss is finite."""
    rows = medians(results)
    fastest = {kind: max(((n, r) for n, r in rows.items() if r["kind"] == kind), key=lambda item: item[1]["tokens_per_s"], default=(None, None))
               for kind in ("halo-full", "trl-peft")}
    (full_name, full), (stock_name, stock) = fastest["halo-full"], fastest["trl-peft"]
    out: dict = {"full_row": full_name, "stock_row": stock_name, "lora_rows": {}}
    for name, lora in rows.items():
        if lora["kind"] != "halo-lora":
            continue
        ratios = {}
        if full:
            ratios["lora_over_full_speed"] = lora["tokens_per_s"] / full["tokens_per_s"]
            ratios["lora_over_full_memory"] = lora["peak_gib"] / full["peak_gib"] if full["peak_gib"] else math.nan
        if stock:
            ratios["lora_over_stock_speed"] = lora["tokens_per_s"] / stock["tokens_per_s"]
            ratios["lora_over_each_stock"] = {n: lora["tokens_per_s"] / r["tokens_per_s"] for n, r in rows.items() if r["kind"] == "trl-peft"}
        for key, target in TARGETS.items():
            if key in ratios:
                ratios[f"{key}_met"] = ratios[key] <= target if key.endswith("memory") else ratios[key] >= target
        out["lora_rows"][name] = ratios
    out["headline"] = next(iter(out["lora_rows"]), None)
    firsts = [r["losses"][0] for r in results if r.get("losses")]
    out["step1_losses"] = {f"{r['variant']}#{r['repeat']}": r["losses"][0] for r in results if r.get("losses")}
    out["step1_spread"] = (max(firsts) - min(firsts)) / abs(statistics.median(firsts)) if firsts else math.nan
    out["losses_finite"] = all(math.isfinite(x) for r in results for x in r.get("losses", []))
    return out


def print_lora_summary(results: list[dict], checks: dict, workdir: Path) -> dict:
    print(f"\n{'row':34} {'tokens/s':>9} {'s/step':>7} {'peak GiB':>9} {'MFU':>6} {'step-1 loss':>11}  lora_B moved")
    for r in results:
        if "tokens_per_s" in r:
            moved = f"{r['lora_B_nonzero']}/{r['lora_B_total']}" if "lora_B_total" in r else ""
            print(f"{r['variant']:34} {r['tokens_per_s']:>9} {r['median_step_s']:>7} {r['peak_gib']:>9} {r['mfu']:>6.3f} {r['losses'][0]:>11.4f}  {moved}")
    result = verdict(results)
    if "lora_vs_peft" in checks:
        print(f"check, Halo's adapters against PEFT's (one layer): {json.dumps(checks['lora_vs_peft'])}")
    print(f"against {result['full_row']} and {result['stock_row']}:")
    for name, ratios in result["lora_rows"].items():
        for key, target in TARGETS.items():
            if key in ratios:
                print(f"  {name}: {key} {ratios[key]:.3f} (target {'<=' if key.endswith('memory') else '>='} {target}: "
                      f"{'met' if ratios[f'{key}_met'] else 'NOT met'})")
    print(f"step-1 losses spread {result['step1_spread']:.2e} relative; every loss finite: {result['losses_finite']}")
    print_reports(results, workdir, None)
    return result


def main() -> None:
    args = parse_args()
    if args.worker:
        return peft_worker(args.worker, args, args.workdir)
    prepare(args.workdir, args.config, args.seq, args.steps * args.batch + 8, None)
    rate, config, checks = start_measuring(args.config, [variant for _, _, variant, _ in args.plan], None)
    if any(kind != "halo-full" for _, kind, _, _ in args.plan):
        try:
            checks.update(check_lora_against_peft(args.config, "cuda" if torch.cuda.is_available() else "cpu"))
        except Exception as exc:  # a finding to report, not a reason to leave the rows untimed
            checks["lora_vs_peft"] = {"agree": False, "error": f"{type(exc).__name__}: {exc}"[-2000:]}
        print(f"LoRA check: {json.dumps(checks['lora_vs_peft'])}", flush=True)
    results, seen = [], {}
    for _ in range(args.repeats):
        for row, kind, variant, spec in args.plan:
            repeat = seen[row] = seen.get(row, -1) + 1  # a row listed twice counts as its repeats
            longest = max((r.get("wall_s", 0.0) for r in results), default=0.0)  # the longest row so far as the estimate
            if args.budget and time.perf_counter() - STARTED + longest > args.budget:
                result = {"repeat": repeat, "kind": kind, "variant": row, "error": f"skipped: it would likely end past --budget {args.budget:.0f} s"}
            else:
                result = with_lora_mfu({"repeat": repeat, "seq": args.seq, "batch": args.batch, **run_row(row, kind, variant, spec, args)}, config, rate)
            print(json.dumps(result), flush=True)
            results.append(result)
            if args.out:  # after every row, so a run cut short keeps what it measured
                write(args.out, rate, checks, results)
    summary = print_lora_summary(results, checks, args.workdir)
    if args.out:
        data = json.loads(args.out.read_text()) if args.out.exists() else {"matmul_tflops": rate / 1e12, "kernel_checks": checks, "results": results}
        args.out.write_text(json.dumps({**data, "lora": LORA, "targets": TARGETS, "verdict": summary}, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
