"""Run-level refusals the launcher makes before any process starts: a model that cannot be found,
method config fields its dataclass refuses, and numbers the optimizer or the dataloader would refuse.

Each of these would otherwise fail in every rank at once, one traceback per rank; here it is one
``ConfigError`` line naming the field, the value and the fix. (Layout rules live in ``check_layout``.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, NamedTuple

from halo_core.errors import ConfigError
from halo_core.lora.checks import check_lora
from halo_core.trainers.image_checks import check_images
from halo_core.trainers.method import get_method
from halo_core.trainers.parts.data import check_columns
from halo_core.trainers.parts.eval_checks import check_eval
from halo_core.trainers.run_config import RunConfig, _one_line, method_config, model_config_of  # noqa: F401 - method_config: its old home
from halo_core.trainers.run_plan import RunPlan

_SEED_RANGE = "between 0 and 2**32 - 1 (numpy's seed range; transformers seeds numpy with it)"


def _steps_strategy(strategy: str) -> Callable[[Any], bool]:
    return lambda args: getattr(args, strategy, None) == "steps"


def _is_rl(args) -> bool:
    """GRPO's configs: their ``beta`` weighs a KL penalty (0 allowed), not a preference loss's temperature."""
    return hasattr(args, "num_generations")


class Range(NamedTuple):
    field: str
    accepted: Callable[[Any], bool]
    must_be: str
    applies: Callable[[Any], bool] = lambda args: True


#: Fields the config dataclass accepts but the optimizer, the scheduler, the dataloader or the training
#: loop would reject (or silently turn into nonsense); a rule is skipped where the method's config lacks its field.
RANGES = tuple(Range(*rule) for rule in (
    ("learning_rate", lambda v: v > 0, "above 0 (at 0 nothing trains; below, the optimizer refuses it), e.g. 1e-5"),
    ("per_device_train_batch_size", lambda v: v >= 1, "at least 1"),
    ("per_device_eval_batch_size", lambda v: v >= 1, "at least 1"),
    ("gradient_accumulation_steps", lambda v: v >= 1, "at least 1 (1 = no accumulation)"),
    ("max_steps", lambda v: v >= 1 or v == -1, "a positive number of steps, or -1 to train for num_train_epochs"),
    ("num_train_epochs", lambda v: v > 0, "above 0 when max_steps is -1", lambda a: a.max_steps == -1),
    ("logging_steps", lambda v: v > 0, "above 0 with logging_strategy 'steps' (below 1: a share of the run)", _steps_strategy("logging_strategy")),
    ("save_steps", lambda v: v > 0, "above 0 with save_strategy 'steps' (below 1: a share of the run)", _steps_strategy("save_strategy")),
    ("eval_steps", lambda v: v is None or v > 0, "above 0 with eval_strategy 'steps'", _steps_strategy("eval_strategy")),
    ("weight_decay", lambda v: v >= 0, "0 or above"),
    ("adam_beta1", lambda v: 0 <= v < 1, "in [0, 1), e.g. 0.9"),
    ("adam_beta2", lambda v: 0 <= v < 1, "in [0, 1), e.g. 0.999"),
    ("adam_epsilon", lambda v: v >= 0, "0 or above, e.g. 1e-8"),
    ("max_grad_norm", lambda v: v is None or v >= 0, "0 or above (0 turns clipping off)"),
    ("dataloader_num_workers", lambda v: v >= 0, "0 or above (0 loads in the training process)"),
    ("seed", lambda v: 0 <= v < 2**32, _SEED_RANGE),
    ("data_seed", lambda v: v is None or 0 <= v < 2**32, _SEED_RANGE),
    ("max_length", lambda v: v is None or v >= 1, "at least 1 token, or empty for no truncation"),
    ("dataset_num_proc", lambda v: v is None or v >= 1, "at least 1, or empty for one process"),
    ("ddp_timeout", lambda v: v > 0, "above 0 seconds (how long any collective waits for the other ranks before the run stops)"),
    ("beta", lambda v: v is None or v > 0, "above 0 (the preference loss's inverse temperature), e.g. 0.1", lambda a: not _is_rl(a)),
    ("beta", lambda v: v >= 0, "0 or above (the KL penalty's weight; 0 keeps no reference policy)", _is_rl),
))


def check_run(run: RunConfig, world: int = 1, model_source: bool = True, plan: RunPlan | None = None) -> RunPlan:
    """Refuse what every rank would fail on (``world``: the launch's process count); ``check_layout`` then checks the
    parallel layout. ``model_source=False``: leave the model's source alone (``halo plan`` reads a config beside the
    YAML for a hub id that is not cached). Returns the launch's ``RunPlan`` (``plan`` where given): the method config
    the checks here share, built once, and the model config as far as they read it."""
    if model_source:
        check_model_source(run)
    plan = plan if plan is not None else RunPlan(run, world)
    args = plan.args
    check_ranges(run, args)
    method = get_method(run.method)
    check_columns(run, method.columns)
    check_eval(run, args, method.columns)
    check_step_keys(run, args)
    check_attn_implementation(run, args, plan)
    if method.check is not None:
        method.check(run, args, world)
    check_images(run, method, args, world, plan)  # after the method's own (grpo names the row with images)
    check_lora(run, world, plan)
    return plan


def check_step_keys(run: RunConfig, args) -> None:
    """``overlap_optimizer_step`` (AdamWBF16 on a GPU, no FSDP2 units) and ``sdpa_backends`` (PyTorch's names)."""
    import torch

    from halo_core.trainers.runtime import SDPA_BACKENDS

    halo, where = run.halo, run.source
    unknown = [n for n in halo.sdpa_backends if n not in SDPA_BACKENDS]
    if unknown or len(set(halo.sdpa_backends)) != len(halo.sdpa_backends):
        raise ConfigError(f"{where}: sdpa_backends: {halo.sdpa_backends} must name each of {', '.join(SDPA_BACKENDS)} at most once, "
                          f"in the order to try them, e.g. [cudnn, flash, efficient, math]")
    if not halo.overlap_optimizer_step:
        return
    fix = "set overlap_optimizer_step: false"
    if not getattr(args, "bf16", False):
        raise ConfigError(f"{where}: overlap_optimizer_step: true overlaps AdamWBF16's step, which trains with bf16: true; set bf16: true, or {fix}")
    if halo.shard_parameters:
        raise ConfigError(f"{where}: overlap_optimizer_step: true needs shard_parameters: false (FSDP2 gathers each unit's weights on "
                          f"its own streams, which the step's side stream cannot order per layer); set shard_parameters: false, or {fix}")
    engine = getattr(args, "rollout_engine", "hf")
    if engine != "hf":
        raise ConfigError(f"{where}: overlap_optimizer_step: true leaves the step running while the weights would be read for "
                          f"sync to the {engine} servers (outside any forward); use rollout_engine: hf, or {fix}")
    if not torch.cuda.is_available():
        raise ConfigError(f"{where}: overlap_optimizer_step: true runs the step on a CUDA side stream, and this machine has no GPU; {fix}")


#: The ``attn_implementation`` values Halo trains with (transformers' names); others are refused before start.
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_4")


def check_attn_implementation(run: RunConfig, args, plan: RunPlan | None = None) -> None:
    """``attn_implementation``: a name Halo trains with, on a layout and dtype it runs on; FlashAttention-4 installed
    and a Hopper GPU visible (``halo_core/kernels/flash_attention.py``). ``plan``: where the model's config is read."""
    from halo_core.kernels import flash_attention

    halo, where = run.halo, run.source
    name = halo.attn_implementation
    if name is None:
        return
    if name not in ATTN_IMPLEMENTATIONS:
        raise ConfigError(f"{where}: attn_implementation: {name!r} is not one Halo trains with; choose one of {list(ATTN_IMPLEMENTATIONS)} "
                          f"(or leave it unset for the model's default)")
    if halo.context_parallel_size > 1 or halo.tensor_parallel_size > 1:
        raise ConfigError(f"{where}: attn_implementation: {name} with context_parallel_size or tensor_parallel_size above 1 is not "
                          f"supported yet (Halo's context/tensor-parallel attention wraps the model's default); remove attn_implementation, "
                          f"or set both sizes to 1")
    model_class = _model_class(plan.model_config if plan is not None else model_config_of(run))
    supports = {"sdpa": "_supports_sdpa", "flash_attention_4": "_supports_flash_attn"}.get(name)
    if model_class is not None and supports and not getattr(model_class, supports, False):
        raise ConfigError(f"{where}: attn_implementation: {name} is not supported by {model_class.__name__} (transformers' {supports} is off); "
                          f"remove attn_implementation for the model's default, or use eager")
    if name != flash_attention.IMPLEMENTATION:
        return
    if not getattr(args, "bf16", False):
        raise ConfigError(f"{where}: attn_implementation: {name} computes in bf16, and this run trains in float32 (bf16: false); "
                          f"set bf16: true, or use sdpa")
    reason = flash_attention.unavailable_reason()
    if reason:
        raise ConfigError(f"{where}: attn_implementation: {name} cannot run here: {reason}; or use sdpa")


def _model_class(config):
    """The family's causal-LM class for a local model's ``config``, whose ``_supports_*`` flags its other heads share
    (``None`` for a hub id, or a type without one: transformers checks when the worker builds it)."""
    from halo_core.parallel.loading import model_class_for

    try:
        cls = None if config is None else model_class_for(config)
        mapping = getattr(cls, "_model_mapping", None)  # an auto class: the concrete class it builds for this config
        return mapping[type(config)] if mapping is not None else cls
    except Exception:  # noqa: BLE001 - the loader names what is wrong with the folder when it builds the model
        return None


def quantization_of(folder: Path) -> str | None:
    """The quantisation method a checkpoint folder's ``config.json`` names (``fp8``, ...), or ``None``."""
    import json

    config = folder / "config.json"
    try:
        settings = json.loads(config.read_text()).get("quantization_config") if config.exists() else None
    except (OSError, ValueError):
        return None
    return None if not settings else repr(settings.get("quant_method", "?")) if isinstance(settings, dict) else "?"


#: How long the launcher waits for the hub to say whether it serves an id not in the cache, name resolution included
#: (without a network every rank's from_pretrained would otherwise retry for about a minute, then fail).
HUB_PROBE_SECONDS = 10.0


def hub_refusal(repo_id: str) -> str | None:
    """``None`` where the hub serves ``repo_id``'s config.json (a HEAD request, the token huggingface_hub finds); else
    why not, in one line: unknown or gated id, no network, or no answer in ``HUB_PROBE_SECONDS``."""
    import threading

    import huggingface_hub

    answer: list[str | None] = []

    def probe() -> None:
        try:
            huggingface_hub.get_hf_file_metadata(huggingface_hub.hf_hub_url(repo_id, "config.json"), timeout=HUB_PROBE_SECONDS)
            answer.append(None)
        except Exception as exc:  # the hub's own errors (404, 401, gated) and the network's
            first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
            answer.append(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)

    thread = threading.Thread(target=probe, daemon=True)  # a name lookup may outlast the request's own timeout
    thread.start()
    thread.join(HUB_PROBE_SECONDS)
    return answer[0] if answer else f"no answer from {huggingface_hub.constants.ENDPOINT} in {HUB_PROBE_SECONDS:g} s"


def looked_for(value: str, yaml_folder: Path) -> tuple[str, str]:
    """(where a model path was looked for, the fix): an absolute path only where it points; a relative one next to the
    YAML file and under the current folder, each folder named once (they are often the same)."""
    if Path(value).is_absolute():
        return "no such folder", "give the full path of the folder that holds config.json"
    folders = list(dict.fromkeys(str(folder) for folder in (yaml_folder, Path.cwd().resolve())))
    return f"looked in {' and '.join(folders)}", "give the folder that holds config.json relative to the YAML file or the current folder, or its full path"


def check_model_source(run: RunConfig) -> None:
    """A local model folder, or a hub id that ``from_pretrained`` can resolve: well-formed, and cached, or (not offline)
    served by the hub, found out here rather than by every rank's ``from_pretrained`` after a minute of retries."""
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    value = run.halo.model_name_or_path
    where = f"{run.source}: model_name_or_path {value!r}"
    looked, fix = looked_for(value, Path(run.source).resolve().parent)
    path = Path(value)
    if path.is_dir():
        from halo_core.parallel.loading import DEQUANTISED_ON_LOAD

        quantized = quantization_of(path)
        if quantized and quantized.strip("'") not in DEQUANTISED_ON_LOAD:  # MXFP4 (gpt-oss): dequantised to bf16 on load
            raise ConfigError(f"{where} is a quantised checkpoint (config.json: quantization_config {quantized}); Halo trains the "
                              f"unquantised weights and reads no quantised ones: dequantise it first (transformers' from_pretrained, "
                              f"then save_pretrained in bf16), or use the unquantised release")
        return
    if path.exists():
        raise ConfigError(f"{where} is a file; {fix}")
    if value.startswith((".", "/", "~")) or value.count("/") > 1 or "\\" in value:  # a hub id has at most one "/"
        tilde = " (~ is not expanded: write the full path)" if value.startswith("~") else ""
        raise ConfigError(f"{where} is not a local folder ({looked}){tilde}; {fix}")
    try:
        validate_repo_id(value)
    except HFValidationError as exc:
        raise ConfigError(f"{where} is neither a local folder ({looked}) nor a hub id ({_one_line(exc)}); {fix}, or a hub id 'namespace/name'") from None
    if isinstance(try_to_load_from_cache(value, "config.json"), str):
        return  # from_pretrained reads the cache (online, it falls back to it where the hub does not answer)
    if not constants.is_offline_mode():
        reason = hub_refusal(value)
        if reason is None:
            return  # from_pretrained downloads it
        raise ConfigError(
            f"{where} is neither a local folder ({looked}) nor in the Hugging Face cache {constants.HF_HUB_CACHE}, and the hub "
            f"does not serve it ({reason}); check the id and the network, run `hf download {value}` where the hub is "
            f"reachable, or {fix}"
        )
    raise ConfigError(
        f"{where} is neither a local folder ({looked}) nor in the Hugging Face cache {constants.HF_HUB_CACHE}, and the hub "
        f"is offline (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE); {fix}, or run `hf download {value}` while online first"
    )


def check_ranges(run: RunConfig, args) -> None:
    for rule in RANGES:
        if hasattr(args, rule.field) and rule.applies(args) and not rule.accepted(getattr(args, rule.field)):
            value = getattr(args, rule.field)
            raise ConfigError(f"{run.source}: {rule.field}={value!r} must be {rule.must_be}; set it in the YAML or with -- --{rule.field}=VALUE")
