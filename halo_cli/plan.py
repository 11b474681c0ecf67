"""``halo plan RUN.yaml --nproc N``: will the run fit, per GPU, before any GPU is rented (``halo_core.memory_plan``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from halo_core.errors import ConfigError

GIB = 1024**3
#: transformers 5's name for gradient checkpointing (``gradient_checkpointing`` is its deprecated alias).
CHECKPOINTING = "activation_checkpointing"
#: The memory a GPU is taken to have where neither ``--gpu-memory`` nor a local GPU says (an H100's 80 GB).
DEFAULT_GPU_GIB = 80.0
#: Launches larger than this are planned on their first and last ranks only (the first holds the most: FSDP2 gives
#: the first ranks the larger shards of an uneven split, and every other split is even).
ALL_RANKS_UP_TO = 4


def _method(config: Path, method: str | None) -> str:
    """``--method``, else the file's name (``templates/recipes/<model>/sft.yaml``), else its ``# method: NAME`` line."""
    from halo_core.trainers.method import known_methods

    if method:
        return method
    if config.stem in known_methods():
        return config.stem
    for line in config.read_text().splitlines() if config.is_file() else ():
        if line.startswith("# method:"):
            return line.split(":", 1)[1].strip()
    raise ConfigError(f"{config}: name the method with --method (one of {', '.join(known_methods())}); the file's name "
                      f"{config.stem!r} is none of them and it has no '# method: NAME' line")


def model_config(run):
    """The model's config and where it came from: the local folder, the local hub cache, else the ``config.json``
    beside the YAML (a recipe's copy of the published one). Never downloads."""
    from huggingface_hub import try_to_load_from_cache
    from transformers import AutoConfig

    value = run.halo.model_name_or_path
    if Path(value).is_dir():
        return AutoConfig.from_pretrained(value), f"{value}/config.json"
    try:
        cached = try_to_load_from_cache(value, "config.json")
    except Exception:  # noqa: BLE001 - not a hub id
        cached = None
    if isinstance(cached, str):
        return AutoConfig.from_pretrained(value, local_files_only=True), f"the local hub cache ({cached})"
    beside = Path(run.source).resolve().parent / "config.json"
    if beside.is_file():
        return AutoConfig.from_pretrained(beside.parent), f"{beside} (a copy beside the YAML)"
    raise ConfigError(f"{run.source}: model_name_or_path {value!r} is neither a local folder nor in the local hub cache, and "
                      f"{beside} does not exist; put the model's config.json beside the YAML (or `hf download {value} config.json`)")


def peak_total(entry: dict, accumulating: bool) -> int:
    """The rank's peak: gradients and activations are not alive whole at once. The trainer frees the gradients after
    each optimizer step (``zero_grad`` sets them to ``None``); the forward keeps its activations with no gradient, and
    the backward frees a layer's activations as it writes that layer's gradients, so the peak holds the larger of the
    two (measured on an H100, issue 49: the sum over-counted the 3B MoE's peak by 26-30%). With gradient accumulation
    the first micro-batch's gradients stay alive through the next forward: both count."""
    static = sum(v for k, v in entry.items() if k not in ("rank", "gradients", "activations"))
    if accumulating:
        return static + entry["gradients"] + entry["activations"]
    return static + max(entry["gradients"], entry["activations"])

def _optimizer(run, args) -> tuple[str, tuple[int, int], bool]:
    from halo_core.memory_plan import OPTIMIZER_STATE

    name = ("adamw_bf16_kahan" if run.halo.adamw_bf16_kahan else "adamw_bf16") if args.bf16 else str(getattr(args.optim, "value", args.optim))
    return name, OPTIMIZER_STATE.get(name, (2, 4)), name in OPTIMIZER_STATE


def _adapters(run):
    """A LoRA run's (``use_peft``) adapters as the worker adds them (``runtime.with_adapters``), else ``None``."""
    from halo_core.lora import settings

    config = settings.lora_config(run.peft)
    if config is None:
        return None
    from halo_core.lora.inject import add_adapters

    def add(model):
        import warnings

        from transformers.initialization import no_init_weights

        # initialising the adapters' values was most of a LoRA plan's time (two minutes for Qwen3-30B-A3B's experts on
        # a loaded 2-core machine), and only their sizes count
        with warnings.catch_warnings(), no_init_weights():
            warnings.simplefilter("ignore")  # PEFT's, which the run itself shows
            add_adapters(model, config, 0)

    return add


def _teacher(run, args, world: int, dtype, registry):
    """Distill's teacher from ``teacher_model_name_or_path``: its parameter bytes on a rank, laid out by its own degrees
    as ``build_teacher`` lays it out (``teacher_parallel``); ``None`` without one (the student's own starting weights,
    laid out as the student: its parameters again)."""
    from halo_core import memory_plan
    from halo_core.methods.distill import teacher_parallel

    path = args.teacher_model_name_or_path
    if not path:
        return None
    config, _ = model_config(dataclasses.replace(run, halo=dataclasses.replace(run.halo, model_name_or_path=path)))
    parallel = teacher_parallel(run, args, config)
    return lambda rank: memory_plan.rank_bytes(config, parallel, world, rank, dtype, registry, gathered=False).parameters


def _tokens(args, cp: int) -> int:
    """A rank's micro-batch tokens: sequences of ``max_length`` (prompt plus completion for GRPO), two a row for the
    pair methods (chosen and rejected), divided over the context-parallel group."""
    length = getattr(args, "max_length", None)
    if length is None and hasattr(args, "max_completion_length"):
        length = (getattr(args, "max_prompt_length", None) or 512) + args.max_completion_length
    rows = args.per_device_train_batch_size * (2 if hasattr(args, "precompute_ref_log_probs") and hasattr(args, "rpo_alpha") else 1)
    return max(1, rows * (length or 1024) // cp)


def figures(run, world: int, config, *, gpu_bytes: int, ranks=None, rank_cache=None, run_plan=None) -> dict:
    """Every figure of the plan for ``run`` on ``world`` processes (the ``--json`` object). ``run_plan``: the run's
    ``RunPlan`` where the caller has checked it (its method config is reused); else one is made for ``run``."""
    import torch

    from halo_core import memory_plan
    from halo_core.registry import discover
    from halo_core.trainers.run_config import check_layout
    from halo_core.trainers.run_plan import RunPlan

    run_plan = run_plan if run_plan is not None else RunPlan(run, world, model_config=config)
    layout = check_layout(run, world, model_config=config, run_plan=run_plan)
    dims = layout["dims"]
    args = run_plan.args
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    parallel = run.halo.parallel_config()
    registry = discover()
    chosen = tuple(ranks if ranks is not None else (range(world) if world <= ALL_RANKS_UP_TO else (0, world - 1)))
    cache = rank_cache if rank_cache is not None else {}
    per_rank = []
    name, (per_element, per_tensor), known = _optimizer(run, args)
    itemsize = dtype.itemsize
    checkpointing = bool(getattr(args, CHECKPOINTING, False))
    acts = memory_plan.activations(config, _tokens(args, dims.cp), itemsize, tp=dims.tp, etp=dims.etp,
                                   checkpointing=checkpointing, budget=run.halo.activation_memory_budget)
    reference = run.method in memory_plan.REFERENCE and memory_plan.REFERENCE[run.method](args)
    teacher = _teacher(run, args, world, dtype, registry) if run.method == "distill" else None
    num_labels = memory_plan.HEAD_OUTPUTS[run.method](args) if run.method in memory_plan.HEAD_OUTPUTS else None
    for rank in chosen:
        key = (parallel, world, rank, dtype, json.dumps(run.peft, sort_keys=True), num_labels)
        if key not in cache:
            cache[key] = memory_plan.rank_bytes(config, parallel, world, rank, dtype, registry, _adapters(run), gathered=rank == chosen[0],
                                                num_labels=num_labels)
        got = cache[key]
        optimizer = per_element * got.trainable + per_tensor * got.tensors
        gathered = 3 * cache[(*key[:2], chosen[0], *key[3:])].unit  # a unit's weights, the next one's (prefetched), its unsharded gradients
        entry = {"rank": rank, "parameters": got.parameters, "reference": got.parameters if reference else 0,
                 "teacher": (teacher(rank) if teacher else got.parameters) if run.method == "distill" else 0,
                 "gradients": got.trainable, "optimizer": optimizer, "activations": acts, "gathered": gathered}
        entry["total"] = peak_total(entry, accumulating=args.gradient_accumulation_steps > 1)
        entry["save_extra"] = 2 * got.largest
        per_rank.append(entry)
    top = max(per_rank, key=lambda e: e["total"] + e["save_extra"])
    model_bytes = memory_plan.global_bytes(config, dtype, registry, num_labels)
    optimizer_all = sum(e["optimizer"] for e in per_rank) * (world / len(per_rank))
    result = {
        "per_gpu": {k: top[k] for k in ("parameters", "reference", "teacher", "gradients", "optimizer", "activations", "gathered", "total")},
        "save_extra_bytes": top["save_extra"],
        "model_bytes": model_bytes,
        "checkpoint_bytes": int(model_bytes + (optimizer_all if args.save_strategy != "no" else 0)),
        "gpu_bytes": gpu_bytes,
        "fits": top["total"] + top["save_extra"] <= gpu_bytes,
        "family": layout["family"],
        "model_type": layout["model_type"],
        "layout": {"world": world, "dp": dims.dp, "ep": dims.ep, "etp": dims.etp, "tp": dims.tp, "cp": dims.cp,
                   "shard_parameters": parallel.fsdp, "gradient_checkpointing": checkpointing,
                   "activation_memory_budget": run.halo.activation_memory_budget},
        "optimizer": name if known else f"{name} (unknown to the planner: counted as AdamW)",
        "dtype": str(dtype).removeprefix("torch."),
    }
    if len({json.dumps({k: v for k, v in e.items() if k != "rank"}) for e in per_rank}) > 1:
        result["per_rank"] = per_rank
    return result


def _gpu_bytes(gpu_memory: float | None) -> tuple[int, str]:
    import torch

    if gpu_memory is not None:
        return int(gpu_memory * GIB), "--gpu-memory"
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory, torch.cuda.get_device_name(0)
    return int(DEFAULT_GPU_GIB * GIB), f"no local GPU: the default {DEFAULT_GPU_GIB:g} GiB"


#: How many fitting layouts ``--suggest`` lists (the best ones: candidates are tried best first).
SUGGESTIONS = 5


def suggestions(run, world: int, config, gpu_bytes: int) -> list[dict]:
    """Up to ``SUGGESTIONS`` layouts that fit, best first: no recompute before recompute, replicated weights before
    FSDP2, fewer activation-splitting degrees (tp, cp, etp) before more, then the smallest ep. Candidates are planned
    in that order and the search stops once enough fit (each is a meta layout of one rank)."""
    from halo_core.errors import HaloError
    from halo_core.parallel.config import divisors

    candidates = []
    for tp in divisors(world):
        for cp in divisors(world // tp):
            dp = world // (tp * cp)
            for etp in divisors(dp):
                for ep in divisors(dp // etp):
                    for shard in (False, True):
                        for checkpointing in (False, True):
                            candidates.append((checkpointing, shard, tp * cp * etp, ep, tp, cp, etp))
    found, cache = [], {}
    for checkpointing, shard, _, ep, tp, cp, etp in sorted(candidates):
        halo = dataclasses.replace(run.halo, expert_parallel_size=ep, expert_tensor_parallel_size=etp, tensor_parallel_size=tp,
                                   context_parallel_size=cp, shard_parameters=shard)
        candidate = dataclasses.replace(run, halo=halo, trainer={**run.trainer, CHECKPOINTING: checkpointing})
        try:
            got = figures(candidate, world, config, gpu_bytes=gpu_bytes, ranks=(0,), rank_cache=cache)
        except (HaloError, ValueError):
            continue
        if got["fits"]:
            found.append({"layout": got["layout"], "total": got["per_gpu"]["total"], "save_extra_bytes": got["save_extra_bytes"]})
            found[-1]["reason"] = _reason(found[-1], gpu_bytes)
            if len(found) == SUGGESTIONS:
                break
    return found


def _reason(s: dict, gpu_bytes: int) -> str:
    lay = s["layout"]
    splits = ", ".join(f"{k}={lay[k]}" for k in ("ep", "etp", "tp", "cp") if lay[k] > 1) or "no splits"
    weights = "weights sharded by FSDP2" if lay["shard_parameters"] else "weights whole on every rank (fewest collectives)"
    recompute = "layers recomputed in backward" if lay["gradient_checkpointing"] else "no recompute"
    return f"{splits}; {weights}; {recompute}: {(s['total'] + s['save_extra_bytes']) / GIB:.1f} of {gpu_bytes / GIB:.1f} GiB"


def plan(
    ctx: typer.Context,
    config: Annotated[Path, typer.Argument(help="The run's YAML file.")],
    nproc: Annotated[int, typer.Option("--nproc", min=1, help="Processes (GPUs) per node.")] = 1,
    nnodes: Annotated[int, typer.Option("--nnodes", min=1, help="Nodes.")] = 1,
    method: Annotated[Optional[str], typer.Option("--method", help="Training method; default: the file's name (sft.yaml).")] = None,
    gpu_memory: Annotated[Optional[float], typer.Option("--gpu-memory", min=0.0, help="GiB per GPU; default: the local GPU's, else 80.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as one JSON object (bytes as integers).")] = False,
    suggest: Annotated[bool, typer.Option("--suggest", help="Also list the layouts that fit, best first.")] = False,
) -> None:
    """Memory per GPU of a run (parameters, gradients, optimizer state, activations, saving) from its model's config,
    laid out as `halo launch` would; fields after `--` override the file."""
    from halo_core.trainers.method import get_method
    from halo_core.trainers.run_checks import check_run
    from halo_core.trainers.run_config import load_run_config, parse_overrides
    from halo_core.trainers.run_plan import RunPlan

    chosen = get_method(_method(config, method))
    run = load_run_config(chosen.name, chosen.config_class, config, parse_overrides(list(ctx.args)))
    world = nproc * nnodes
    found, source = model_config(run)
    local = Path(run.halo.model_name_or_path).is_dir()
    # a local folder's config, read once; a hub id's copy (cache, beside the YAML) is the layout's only, as the checks
    # leave a hub id's model to the worker
    run_plan = check_run(run, world, model_source=local, plan=RunPlan(run, world, model_config=found) if local else None)
    gpu_bytes, gpu_source = _gpu_bytes(gpu_memory)
    result = figures(run, world, found, gpu_bytes=gpu_bytes, run_plan=run_plan)
    result["config_source"] = source
    if suggest:
        result["suggestions"] = suggestions(run, world, found, gpu_bytes)
    if as_json:
        typer.echo(json.dumps(result, indent=1))
        return
    _print(result, gpu_source)


def summary(result: dict) -> str:
    """The plan in one line (a recipe's ``# halo plan:`` header, which ``tests/test_recipes.py`` holds to this)."""
    lay, per = result["layout"], result["per_gpu"]
    gib = lambda b: f"{b / GIB:.2f}"  # noqa: E731
    parts = ", ".join(f"{k} {gib(per[k])}" for k in ("parameters", "reference", "teacher", "gradients", "optimizer", "activations", "gathered") if per[k])
    return (f"{gib(per['total'])} GiB per GPU ({parts}; save extra {gib(result['save_extra_bytes'])}), "
            f"{'fits' if result['fits'] else 'does NOT fit'} in {result['gpu_bytes'] / GIB:g} GiB; "
            f"dp {lay['dp']} x cp {lay['cp']} x tp {lay['tp']}, ep {lay['ep']} x etp {lay['etp']}, "
            f"{'FSDP2' if lay['shard_parameters'] else 'replicated'}{', checkpointing' if lay['gradient_checkpointing'] else ''}")


def _print(result: dict, gpu_source: str) -> None:
    lay = result["layout"]
    g = lambda b: f"{b / GIB:8.2f} GiB" if b >= GIB else f"{b / 2**20:8.2f} MiB"  # noqa: E731
    typer.echo(f"model config: {result['config_source']}")
    typer.echo(f"family: {result['family'] or 'none (plain FSDP2 route)'}   model type: {result['model_type']}   {result['dtype']}, "
               f"optimizer {result['optimizer']}")
    typer.echo(f"layout: world {lay['world']} = dp {lay['dp']} x cp {lay['cp']} x tp {lay['tp']}; ep {lay['ep']} x etp {lay['etp']}; "
               f"shard_parameters {str(lay['shard_parameters']).lower()}, gradient_checkpointing {str(lay['gradient_checkpointing']).lower()}")
    typer.echo("per GPU (the rank that needs the most):")
    for key, value in result["per_gpu"].items():
        typer.echo(f"  {key:<12}{g(value)}")
    typer.echo(f"  {'save extra':<12}{g(result['save_extra_bytes'])}")
    typer.echo(f"checkpoint on disk: {g(result['checkpoint_bytes']).strip()} (the model alone: {g(result['model_bytes']).strip()})")
    typer.echo(f"summary: {summary(result)}")
    verdict = "fits" if result["fits"] else "does NOT fit"
    typer.echo(f"{verdict} in {g(result['gpu_bytes']).strip()} per GPU ({gpu_source})")
    for s in result.get("suggestions", []):
        typer.echo(f"  suggest: {s['reason']}")
    if "suggestions" in result and not result["suggestions"]:
        typer.echo("  no layout of this world fits; add GPUs (--nproc / --nnodes) or shorten max_length")
