"""``output_dir`` checked before start: writable, and with room for one checkpoint.

Otherwise an unwritable or full ``output_dir`` is found at the first save: after half the embedded run, after hours
at scale. The launcher (``halo launch``, ``--dry-run`` included) calls ``check_output_dir``.

The checkpoint's size is estimated from the model and the run, not measured: the model's parameters counted on the
meta device (the class the worker builds, ``loading.model_class_for``), in the dtype the run trains in, plus the
optimizer state the run keeps, one tensor per element-wise state in its dtype (``STATES``), unless
``save_only_model``; plus the model folder's other files (tokenizer, configs), which every save copies, and
``SMALL_FILES`` for the trainer's own (1.3% of the tiny model's checkpoint without it). A run that
saves no checkpoints (``save_strategy: no``) still writes the model into ``output_dir`` at the end: the model alone.
A LoRA run's adapters are not counted (small, and counting them would build them); a random-init LoRA run writes
its whole base to ``OUTPUT_DIR/base``, which is. A hub id with no local folder cannot be counted: only the writable
check runs.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from halo_core.errors import ConfigError
from halo_core.trainers.run_config import model_config_of
from halo_core.trainers.run_plan import RunPlan

FIELD = "output_dir"
#: Element-wise optimizer states per trainable element, as the bytes of each: ``"param"`` (the parameter's dtype, as
#: ``torch.zeros_like``), or a number of bytes. Optimizers not named here are counted as AdamW (two states).
ADAM = ("param", "param")
STATES = {
    "sgd": (),  # one momentum buffer when optim_args sets momentum (``optimizer_states``)
    "adagrad": ("param",),
    "rmsprop": ("param",),  # plus momentum_buffer with momentum, grad_avg when centered
    "adafactor": (),  # a row and a column of second moments per matrix: small beside the weights
    "lomo": (),
    "adalomo": (),
    "adamw_8bit": (1, 1),
    "adamw_bnb_8bit": (1, 1),
    "paged_adamw_8bit": (1, 1),
}
#: The rest of a save, whatever the model: trainer state, RNG and scheduler state, safetensors headers (about 40 KB
#: for the tiny model's checkpoint).
SMALL_FILES = 2**20
#: Files of a model folder that are weights (the checkpoint's own weights replace them).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")


def check_output_dir(run, world: int = 1, plan: RunPlan | None = None) -> None:
    """Refuse an ``output_dir`` that cannot be written, or whose filesystem lacks room for one checkpoint.
    ``plan``: the launch's ``RunPlan`` (its method and model configs, built once); else built here."""
    output_dir = run.trainer.get(FIELD) or "trainer_output"  # TrainingArguments' default
    where = f"{run.source}: {FIELD} {output_dir!r}"
    folder = _nearest_existing(Path(output_dir))
    if not folder.is_dir():
        raise ConfigError(f"{where} cannot be created: {folder} is a file, not a folder; set {FIELD} to a folder path")
    reason = _unwritable(folder)
    if reason:
        raise ConfigError(f"{where} is not writable ({folder}: {reason}); set {FIELD} to a folder you can write, on a writable filesystem")
    needed = checkpoint_bytes(run, world, plan)
    if needed is None:
        return
    free = shutil.disk_usage(folder).free
    if free < needed[0]:
        raise ConfigError(
            f"{where}: its filesystem ({folder}) has {free} bytes free ({_gib(free)}), and one checkpoint of this run needs about "
            f"{needed[0]} bytes ({_gib(needed[0])}: {needed[1]}); free space there, or set {FIELD} to a filesystem with room"
        )


def checkpoint_bytes(run, world: int = 1, plan: RunPlan | None = None) -> tuple[int, str] | None:
    """About how many bytes one save of this run writes, and what they are; ``None`` where the model cannot be counted."""
    folder = Path(run.halo.model_name_or_path)
    if not folder.is_dir():
        return None
    plan = plan if plan is not None else RunPlan(run, world)
    args = plan.args
    bf16 = bool(args.bf16)
    lora = bool(run.peft.get("use_peft"))
    params, itemsize = parameter_count(run, args, plan.model_config), 2 if bf16 else 4
    weights = params * itemsize if not lora or run.halo.random_init else 0
    parts = [f"{weights} of weights ({params} parameters x {itemsize} bytes)" if weights else "the adapters (not counted)"]
    optimizer = 0
    if not lora and not args.save_only_model and str(getattr(args.save_strategy, "value", args.save_strategy)) != "no":
        states = optimizer_states(args, bf16, run.halo.adamw_bf16_kahan)
        optimizer = params * sum(itemsize if size == "param" else size for size in states)
        parts.append(f"{optimizer} of optimizer state ({len(states)} per parameter)")
    others = sum(path.stat().st_size for path in folder.iterdir() if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES))
    parts.append(f"{others} of tokenizer and config files, {SMALL_FILES} for the rest")
    return weights + optimizer + others + SMALL_FILES, ", ".join(parts)


def parameter_count(run, args, config=None) -> int:
    """The parameters of the model the worker builds, counted on the meta device (tied weights once, as saved).
    ``config``: the model's config where the caller read it (the plan's); else read here."""
    import copy

    import torch
    from accelerate import init_empty_weights

    from halo_core.parallel.loading import build_from_config, model_class_for, sequence_head
    from halo_core.trainers.method import get_method

    config = config if config is not None else model_config_of(run)
    head = get_method(run.method).sequence_classification
    if head:
        config = copy.deepcopy(config)  # the caller's config stays the model's own
        sequence_head(config, getattr(args, "num_labels", None) or 1, None)
    with init_empty_weights():
        model = build_from_config(model_class_for(config, sequence_classification=head), config, dtype=torch.float32)
    return sum(p.numel() for p in model.parameters())


def optimizer_states(args, bf16: bool, kahan: bool) -> tuple:
    """The element-wise states the run's optimizer keeps per trainable element (``STATES``' units)."""
    if bf16:  # AdamWBF16 (``parts/optimizer.py``): bf16 moments, and a bf16 compensation buffer with Kahan
        return ("param",) * (3 if kahan else 2)
    name = str(getattr(args.optim, "value", args.optim))
    settings = _optim_args(args)
    if name == "sgd":
        return ("param",) if float(settings.get("momentum", 0)) > 0 else ()
    if name == "rmsprop":
        return ("param",) * (1 + (float(settings.get("momentum", 0)) > 0) + (settings.get("centered", "").lower() in ("true", "1", "yes")))
    return STATES.get(name, ADAM)


def _optim_args(args) -> dict[str, str]:
    """transformers' ``optim_args`` (``"momentum=0.9,nesterov=True"``) as a dict."""
    text = getattr(args, "optim_args", None) or ""
    return dict(item.split("=", 1) for item in text.replace(" ", "").split(",") if "=" in item)


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (a relative path is taken from the current folder, as the run does)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _unwritable(folder: Path) -> str | None:
    """Why a file cannot be created in ``folder`` (tried: permissions and mount flags vary, and root passes ``chmod``),
    or ``None``."""
    probe = folder / f".halo-write-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except FileExistsError:
        return None
    except OSError as exc:
        return "read-only filesystem" if exc.errno == errno.EROFS else (exc.strerror or str(exc)).lower()
    probe.rmdir()
    return None


def _gib(count: int) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.2f} MiB"
