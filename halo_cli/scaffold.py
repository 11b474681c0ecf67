"""``halo new-family``: renders ``templates/family`` into an installable plugin package.

The layout fields are read off a tiny instance of the model type's transformers classes,
so the scaffold is right for the common case before its author writes a line.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from string import Template

import halo_core
from halo_core.errors import HaloError
from halo_core.family import PLUGIN_API_VERSION, Family, is_valid_family_name


class ScaffoldError(HaloError):
    """A ``halo new-family`` argument that cannot produce a plugin."""


@dataclass(frozen=True)
class ScaffoldNames:
    family: str
    distribution: str
    package: str


def plugin_names(name: str) -> ScaffoldNames:
    package_stem = name.replace("-", "_")
    if not is_valid_family_name(name) or keyword.iskeyword(package_stem):
        raise ScaffoldError(
            f"family name {name!r} is not valid: use lower-case letters, digits, '-' or '_', starting with a "
            f"letter (e.g. 'my-moe'), so that 'halo_plugin_{package_stem}' is a Python package name"
        )
    return ScaffoldNames(family=name, distribution=f"halo-plugin-{name}", package=f"halo_plugin_{package_stem}")


def _known_model_type(model_type: str) -> bool:
    from transformers import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


@dataclass(frozen=True)
class ReadLayout:
    fields: dict
    model_class: str
    summary: str
    found_moe: bool


def _read_layout(model_type: str) -> ReadLayout:
    """Layout fields read off a tiny meta-device model of ``model_type``, with a summary for the docstring."""
    defaults = Family(name="x", model_types=("x",), version="0", api_version=PLUGIN_API_VERSION)
    fallback = {"moe_block": defaults.moe_block, "router": defaults.router, "experts": defaults.experts, "attention": defaults.attention}
    try:
        from halo_core.layout import infer_layout
        from halo_core.tiny import tiny_model

        model = tiny_model(model_type, device="meta")
    except Exception as exc:  # unknown or custom architectures: keep the common-case defaults
        note = f"- could not build a tiny model ({type(exc).__name__}: {exc}); fields below are the common-case defaults, check them"
        return ReadLayout(fallback, "?", note, found_moe=False)
    inferred = infer_layout(model)
    layout = {**fallback, **{k: v for k, v in inferred.items() if v}}
    lines = [
        f"- MoE blocks: {', '.join(inferred['moe_block']) or 'none found (fields below are defaults)'}",
        f"- router child: {inferred.get('router', '?')}; experts child: {inferred.get('experts', '?')}",
        f"- attention: {', '.join(inferred['attention']) or 'none found (field below is a default)'}",
    ]
    return ReadLayout(layout, type(model).__name__, "\n".join(lines), found_moe=bool(inferred["moe_block"]))


def _literal(value) -> str:
    if isinstance(value, tuple) and len(value) == 1:
        return repr(value[0])
    return repr(value)


def render_family(name: str, model_type: str, output_dir: Path, *, allow_unknown_model_type: bool = False) -> Path:
    """Write ``output_dir/halo-plugin-<name>/`` and return its path; refuse before writing anything."""
    names = plugin_names(name)
    target = Path(output_dir) / names.distribution
    if target.exists():
        raise ScaffoldError(f"{target} already exists; choose another --output-dir or remove it first")
    if not allow_unknown_model_type and not _known_model_type(model_type):
        raise ScaffoldError(
            f"model type {model_type!r} is unknown to the installed transformers; check the spelling "
            f"(it is the config's `model_type`), or pass --allow-unknown-model-type for architectures "
            f"that ship their own modeling code"
        )
    read = _read_layout(model_type)
    values = {
        "name": names.family,
        "distribution": names.distribution,
        "package": names.package,
        "model_type": model_type,
        "model_class": read.model_class,
        "found": read.summary,
        "core_version": halo_core.__version__,
        "api_version": PLUGIN_API_VERSION,
        "name_literal": repr(names.family),
        "model_type_literal": repr(model_type),
        "splits_literal": "{'ep'}" if read.found_moe else "",
        **{f"{k}_literal": _literal(v) for k, v in read.fields.items()},
    }
    template_root = files("halo_cli.templates") / "family"
    _render_tree(template_root, target, values, names.package)
    return target


def _render_tree(source, target: Path, values: dict, package: str) -> None:
    for entry in source.iterdir():
        name = entry.name.replace("__package__", package)
        if entry.is_dir():
            if entry.name != "__pycache__":
                _render_tree(entry, target / name, values, package)
            continue
        if not name.endswith(".tmpl"):
            continue
        out = target / name.removesuffix(".tmpl")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(Template(entry.read_text()).substitute(values))
