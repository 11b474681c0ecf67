"""A run's configuration: one YAML file plus ``--field=value`` overrides, checked before any process starts.

Keys are Halo's own (``HaloArguments``), the method's TRL/transformers config fields, or TRL's
``ModelConfig`` LoRA fields (``use_peft``, ``lora_r``, ...: ``halo_core.lora.settings``).
Unknown keys (with the closest valid key), wrong types, missing data, and impossible
parallel layouts (degrees against the world size, experts against ``ep``, splits the
model's family does not declare) are refused with a ``ConfigError`` naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from halo_core.errors import ConfigError, HaloError, WorldSizeError
from halo_core.parallel.config import RUN_KEYS
from halo_core.parallel.plan import plan_layout
from halo_core.trainers import dataset_keys, yaml_loader
from halo_core.trainers.arguments import DatasetSource, HaloArguments
from halo_core.trainers.typecheck import coerce, describe, matches

#: Fields resolved against the YAML file's folder when that path exists there.
_PATH_FIELDS = ("model_name_or_path",)
#: Method-config fields that name a model folder, read relative to the YAML file as model_name_or_path is.
_TRAINER_PATH_FIELDS = ("teacher_model_name_or_path",)
#: Fields that take more than their dataclass annotation says, as ``Trainer.train`` does (``true``: the latest checkpoint).
_WIDER_TYPES = {"resume_from_checkpoint": str | bool | None}


@dataclass
class RunConfig:
    method: str
    halo: HaloArguments
    #: Fields of the method's TRL/transformers config, validated, ready for ``config_class(**trainer)``.
    trainer: dict[str, Any]
    source: str
    #: TRL ``ModelConfig`` fields the run sets (LoRA and quantisation), validated; ``{}`` trains every weight.
    peft: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return {"method": self.method, "halo": dataclasses.asdict(self.halo), "trainer": self.trainer, "source": self.source, "peft": self.peft}

    @classmethod
    def from_json(cls, data: dict) -> "RunConfig":
        halo = dict(data["halo"])
        halo["dataset"] = [DatasetSource(**d) for d in halo["dataset"]]
        halo["eval_dataset"] = [DatasetSource(**d) for d in halo.get("eval_dataset", [])]
        return cls(data["method"], HaloArguments(**halo), data["trainer"], data["source"], data.get("peft", {}))


def parse_overrides(tokens: list[str]) -> dict[str, Any]:
    """``["--lr=1e-3", "--max_steps", "5"]`` -> ``{"lr": 0.001, "max_steps": 5}`` (values parsed as YAML)."""
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or token == "--":
            raise ConfigError(f"override {token!r} is not of the form --field=value or --field value")
        key, eq, value = token[2:].partition("=")
        if not eq:
            if i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
                raise ConfigError(f"override --{key} has no value; write --{key}=VALUE")
            value = tokens[i + 1]
            i += 1
        overrides[key.replace("-", "_")] = yaml_loader.load(value) if value != "" else ""
        i += 1
    return overrides


def _type_hints(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}


def _check_key(key: str, known: set[str], where: str) -> None:
    if key not in known:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else "; see agent-docs/configuration.md for the valid keys"
        raise ConfigError(f"{where}: unknown key {key!r}{hint}")


def _check_value(key: str, value: Any, annotation: Any, where: str) -> Any:
    """The value, coerced where YAML left a number as a string; a ``ConfigError`` if it does not fit."""
    value = coerce(value, annotation)
    if not matches(value, annotation):
        raise ConfigError(f"{where}: {key} must be {describe(annotation)}, got {value!r} ({type(value).__name__})")
    return value


def _datasets(raw: Any, base: Path, where: str, field: str = "dataset") -> list[DatasetSource]:
    if isinstance(raw, (str, dict)):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: {field} must be a non-empty list of sources, each with a 'path'")
    hints = _type_hints(DatasetSource)
    sources = []
    for index, entry in enumerate(raw):
        entry = {"path": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or "path" not in entry:
            raise ConfigError(f"{where}: {field}[{index}] needs a 'path' (a .jsonl/.json/.parquet file, a saved folder or a hub id)")
        dataset_keys.check_entry(entry, index, where, field)
        for key, value in entry.items():
            _check_key(key, set(hints), f"{where}: {field}[{index}]")
            entry[key] = _check_value(f"{field}[{index}].{key}", value, hints[key], where)
        entry = dataset_keys.resolve_data_files(entry, base)
        local = base / entry["path"]
        if local.exists():
            entry = {**entry, "path": str(local.resolve())}
        elif Path(entry["path"]).suffix in {".jsonl", ".json", ".parquet"} or entry["path"].startswith((".", "/")):
            looked = "no such file or folder" if Path(entry["path"]).is_absolute() else f"looked in {base.resolve()}, the YAML file's folder"
            raise ConfigError(f"{where}: {field}[{index}].path {entry['path']!r} does not exist ({looked})")
        sources.append(DatasetSource(**entry))
    return sources


def load_run_config(method: str, config_class: type, yaml_path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Merge the YAML file and the overrides (which win) and check every key and value."""
    path = Path(yaml_path)
    where = str(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        raw = yaml_loader.load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping of field: value")
    merged = dataset_keys.trl_mixture({**raw, **(overrides or {})}, where)

    from halo_core.lora import settings as lora_settings

    halo_hints = _type_hints(HaloArguments)
    trainer_hints = _type_hints(config_class)
    trainer_hints.update({k: t for k, t in _WIDER_TYPES.items() if k in trainer_hints})
    peft_hints = {k: t for k, t in lora_settings.type_hints().items() if k not in trainer_hints and k not in halo_hints}
    known = set(halo_hints) | set(trainer_hints) | set(peft_hints)
    for key in merged:
        _check_key(key, known, where)
    for key in ("model_name_or_path", "dataset"):
        if key not in merged:
            raise ConfigError(f"{where}: {key} is required")

    halo_fields = {k: v for k, v in merged.items() if k in halo_hints}
    halo_fields["dataset"] = _datasets(halo_fields["dataset"], path.parent, where)
    if "eval_dataset" in halo_fields:
        halo_fields["eval_dataset"] = _datasets(halo_fields["eval_dataset"], path.parent, where, "eval_dataset")
    for key, value in halo_fields.items():
        if key not in ("dataset", "eval_dataset"):
            halo_fields[key] = _check_value(key, value, halo_hints[key], where)
    for key in _PATH_FIELDS:
        local = path.parent / halo_fields[key]
        if local.exists():
            halo_fields[key] = str(local.resolve())
    trainer = {k: v for k, v in merged.items() if k in trainer_hints and k not in halo_hints}
    for key, value in trainer.items():
        trainer[key] = _check_value(key, value, trainer_hints[key], where)
    for key in _TRAINER_PATH_FIELDS:
        if trainer.get(key) and (path.parent / trainer[key]).exists():
            trainer[key] = str((path.parent / trainer[key]).resolve())
    peft = {k: _check_value(k, v, peft_hints[k], where) for k, v in merged.items() if k in peft_hints}
    dataset_keys.check_mixture(halo_fields["dataset"], method, trainer, halo_fields.get("dataset_stopping_strategy", "first_exhausted"), where)
    return RunConfig(method, HaloArguments(**halo_fields), trainer, where, peft)


def check_layout(run: RunConfig, world_size: int, registry=None, model_config=None, run_plan=None) -> dict:
    """Refuse a layout that cannot work on ``world_size`` processes; return the resolved degrees and family.
    ``model_config``: the model's config where the caller has it (``halo plan``); else read from a local folder.
    ``run_plan``: the launch's ``RunPlan``, whose model config and precision it uses (each read once per launch).

    The layout's own rules are ``plan_layout``'s; only the run-level ones (what the method can feed,
    compile and memory budgets, kernels) live here.
    """
    from halo_core.registry import discover
    from halo_core.trainers.method import get_method

    if run.halo.fsdp_unit_layers < 1:
        raise ConfigError(f"{run.source}: fsdp_unit_layers={run.halo.fsdp_unit_layers} must be a positive integer (consecutive decoder layers per FSDP unit; 1 = one unit per layer)")
    if run.halo.experts_implementation is not None:
        _check_experts_implementation(run)
    _check_activation_memory_budget(run)
    model_config = model_config if model_config is not None else run_plan.model_config if run_plan is not None else model_config_of(run)
    itemsize = 2 if (run_plan.bf16 if run_plan is not None else _trains_in_bf16(run, world_size)) else 4
    try:
        plan = plan_layout(run.halo.parallel_config(), model_config, registry or discover(), world_size, itemsize=itemsize,
                           experts_implementation=run.halo.experts_implementation, trainable_splits=get_method(run.method).splits, names=RUN_KEYS)
    except HaloError as exc:
        raise ConfigError(f"{run.source}: {_in_run_words(exc)}") from None
    dims = plan.dims
    method_splits = get_method(run.method).splits
    beyond_method = sorted(s for s in plan.splits if s not in method_splits)
    if beyond_method:
        raise ConfigError(
            f"{run.source}: method {run.method!r} cannot train with {', '.join(f'{s}={getattr(dims, s)}' for s in beyond_method)} yet "
            f"(it supports {sorted(method_splits)}); set {', '.join(RUN_KEYS[s] for s in beyond_method)} to 1"
        )
    if run.halo.compile_layers and dims.tp > 1:
        from halo_core.trainers.parts.compile import TP_UNSUPPORTED

        raise ConfigError(f"{run.source}: {TP_UNSUPPORTED}")
    return {"dims": dims, "model_type": plan.model_type, "family": plan.record.name if plan.record else None}


#: The keys that set the degrees and how they lay out (all but ``shard_parameters``, which changes no degree).
_LAYOUT_KEYS = " / ".join(key for field, key in RUN_KEYS.items() if field != "fsdp")


def _in_run_words(exc: HaloError) -> str:
    """A layout refusal as a run reads it: ``plan_layout`` already named the degrees by their keys (``names=RUN_KEYS``);
    a rule on products of degrees and the world size (``ep*etp``, ``cp*tp``) also gets the keys that set them."""
    if isinstance(exc, WorldSizeError):
        return f"{exc} (set in {_LAYOUT_KEYS}, or change --nproc)"
    return str(exc)


def _trains_in_bf16(run: RunConfig, world: int = 1) -> bool:
    """Whether the worker builds bf16 weights (``runtime.build_model``): the method config's ``bf16`` as it resolves it
    (TRL's default is bf16 unless ``fp16``)."""
    return bool(method_config(run, world).bf16)


def _check_experts_implementation(run: RunConfig) -> None:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    from halo_core.kernels import liger
    from halo_core.parallel.expert_parallel import IMPLEMENTATION

    name = run.halo.experts_implementation
    known = sorted({*ALL_EXPERTS_FUNCTIONS.valid_keys(), "eager", liger.EXPERTS_IMPLEMENTATION} - {IMPLEMENTATION})
    if name not in known:
        raise ConfigError(f"{run.source}: experts_implementation {name!r} is unknown; choose one of {known} (or leave it empty for the model's default)")
    if name == liger.EXPERTS_IMPLEMENTATION and liger.unavailable_reason():
        raise ConfigError(f"{run.source}: experts_implementation {name!r} cannot run here: {liger.unavailable_reason()}; use grouped_mm")


def _check_activation_memory_budget(run: RunConfig) -> None:
    budget = run.halo.activation_memory_budget
    if budget is None:
        return
    if not run.halo.compile_layers:
        raise ConfigError(f"{run.source}: activation_memory_budget={budget} applies to compiled layers only; set compile_layers: true or remove it")
    if not 0 < budget <= 1:
        raise ConfigError(f"{run.source}: activation_memory_budget must be in (0, 1], got {budget}; e.g. 0.5 recomputes about half of the layers' activations")


def model_config_of(run: RunConfig):
    """The model's transformers config from its local folder (``None`` for a hub id, read when the worker loads it);
    a ``ConfigError`` where the folder has none. The launcher reads it once, into its ``RunPlan``."""
    from transformers import AutoConfig

    folder = Path(run.halo.model_name_or_path)
    if not folder.exists():
        if run.halo.random_init:
            raise ConfigError(f"{run.source}: random_init needs a local model folder with config.json; {folder} does not exist")
        return None  # a hub id: checked when the worker loads it
    try:
        return AutoConfig.from_pretrained(folder)
    except Exception as exc:
        raise ConfigError(f"{run.source}: model_name_or_path {folder} has no readable config.json ({exc})") from None


def method_config(run: RunConfig, world: int = 1):
    """The method's config dataclass built from the run's fields, as the worker builds it; its ``ValueError``
    becomes one line naming the field that set it off.

    Built with ``use_cpu=True`` whatever the machine: checking needs no device, and a GPU build would leave
    a CUDA context on GPU 0 in torchrun's parent for the whole run. The worker, or a one-process run right
    after, builds its own; transformers resets accelerate's process state on each build.
    """
    from halo_core.trainers.method import get_method

    config_class = get_method(run.method).config_class
    try:
        return _build(config_class, run.trainer, world)
    except ValueError as exc:
        message = _one_line(exc)
    culprit = _culprit(config_class, run.trainer, world)
    if culprit is None:
        raise ConfigError(f"{run.source}: {config_class.__name__} refuses this run's fields: {message}")
    raise ConfigError(f"{run.source}: {culprit}={run.trainer[culprit]!r} is refused by {config_class.__name__}: {message}; change {culprit}")


def _build(config_class: type, fields: dict, world: int = 1):
    """Built as each of ``world`` workers builds it: a config that checks against the world size (GRPO's generation
    batch) sees the launch's, not this one process's. transformers reads ``world_size`` from the process group, which
    the launcher has none of (starting one to build a config would be the workers' job), hence the subclass."""
    if world > 1:
        config_class = type(config_class.__name__, (config_class,), {"world_size": property(lambda self: world)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the worker shows the config's own warnings once it builds it
        from halo_core.trainers.runtime import checkpointing_named  # imports torch: only once a config is built

        return config_class(**checkpointing_named(config_class, {**fields, "use_cpu": True}))


def _culprit(config_class: type, fields: dict, world: int = 1) -> str | None:
    """The first field, in the YAML's order, whose addition makes the dataclass refuse."""
    tried: dict = {}
    for key, value in fields.items():
        tried[key] = value
        try:
            _build(config_class, tried, world)
        except ValueError:
            return key
    return None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
