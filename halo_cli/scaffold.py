"""``halo new-family``: renders ``templates/family`` into an installable plugin package.

The layout fields are read off a tiny instance of the model type's transformers classes,
so the scaffold is right for the common case before its author writes a line.
"""

from __future__ import annotations

import keyword
import re
import shlex
import sys
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


def replaced_distribution(model_types, replace: str | None) -> str | None:
    """The installed distribution the new plugin is to replace (``--replace NAME``), or ``None``.

    ``model_types``: those the new plugin claims (a type, and the text part its class builds on where that is
    another: Llama 4's ``llama4_text``). Refuses a type another installed plugin claims: two plugins claiming one
    type both turn broken, so a silent scaffold would break the installed plugin as well as the new one."""
    from halo_core.registry import discover

    types = [model_types] if isinstance(model_types, str) else list(model_types)
    claimants = [r for r in discover(strict=False).records if r.family and any(t in r.family.model_types for t in types)]
    named = [r for r in claimants if replace in {r.name, r.entry_point, r.distribution}]
    others = [r for r in claimants if r not in named]
    if others:
        other = others[0]
        claimed = next(t for t in types if t in other.family.model_types)
        raise ScaffoldError(
            f"model type {claimed!r} is already claimed by the installed plugin {other.name!r} ({other.distribution}); "
            f"scaffold another model type, or pass --replace {other.name} for a plugin meant to be installed instead of it"
        )
    if replace and not named:
        raise ScaffoldError(f"--replace {replace}: no installed plugin claims model type {' or '.join(map(repr, types))}, "
                            f"so there is nothing to replace; drop --replace")
    return named[0].distribution if named else None


@dataclass(frozen=True)
class Scaffold:
    path: Path
    family: str
    replaces: str | None

    def next_steps(self) -> str:
        """The commands to run next, through the interpreter ``halo`` runs in: a bare ``pip`` may be another
        environment's, and a bare ``halo`` is not on PATH unless that environment is activated."""
        python = shlex.quote(sys.executable)
        steps = [f"{python} -m pip uninstall -y {self.replaces}"] if self.replaces else []
        steps += [f"{python} -m pip install -e {shlex.quote(str(self.path))}", f"{python} -m halo_cli families show {self.family}"]
        return " && ".join(steps)


def _known_model_type(model_type: str) -> bool:
    from transformers import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


@dataclass(frozen=True)
class ReadLayout:
    fields: dict
    model_class: str
    summary: str
    found_moe: bool
    #: The ``Family.model_class`` to declare: ``None`` where ``AutoModelForCausalLM`` maps the config.
    declared_class: str | None = None
    #: What the scaffold could not determine, as the marked spot the plugin's docstring and test carry, else ``None``.
    marked: str | None = None
    #: The model type of the config the class builds on, where it is another (a composite's causal-LM class takes
    #: its text part: ``Qwen3_5MoeForCausalLM`` builds ``qwen3_5_moe_text``), claimed too.
    built_type: str | None = None
    #: False where one forward of the tiny model shows a router that calls no ``torch.topk`` (``Family.routing_replay``).
    routing_replay: bool = True


#: How every spot a scaffold could not fill in starts (in the plugin's docstring, and its test fails with it).
MARK = "TODO(halo new-family)"
#: The marked spot of a type that cannot be trained as a causal LM (no class puts a language-model head on it).
CANNOT_TRAIN_MARK = f"{MARK}: cannot be trained as a causal LM"
#: The marked spot of a type whose config counts experts where no module is at transformers' experts interface.
NO_MOE_MARK = f"{MARK}: no MoE block at transformers' experts interface"
#: The marked spot of a type the scaffold could not build a tiny model of.
NO_TINY_MARK = f"{MARK}: could not build a tiny model"


def claimed_model_type(model_type: str) -> tuple[str, str]:
    """The model type a scaffold for ``model_type`` claims, and a docstring line saying why where it is another.

    A text sub-config with no language-model class of its own (``qwen3_vl_moe_text``) is trained as part of its
    composite, so the plugin is written for the composite that has one (``qwen3_vl_moe``)."""
    if not _known_model_type(model_type):
        return model_type, ""
    from halo_core.hf_config import composites_of, language_model_class

    if not language_model_class(model_type).missing:
        return model_type, ""
    for parent in composites_of(model_type):
        if not language_model_class(parent).missing:
            return parent, (f"`{model_type}` is the text part of `{parent}` and has no language-model head of its own, "
                            f"so this plugin claims `{parent}`, trained whole.\n\n")
    return model_type, ""


def built_model_type(model_type: str) -> str | None:
    """The model type of the config part ``model_type``'s language-model class builds on, where it is another (Llama
    4's causal LM builds on ``llama4_text``; Kimi-K2.5's on its own config): the scaffold claims that part too."""
    from halo_core.hf_config import language_model_class
    from halo_core.tiny import tiny_model

    try:
        lm = language_model_class(model_type)
        if lm.missing:
            return None
        built = getattr(tiny_model(model_type, device="meta", model_class=lm.name).config, "model_type", model_type)
    except Exception:  # no tiny model: the scaffold marks it, and claims the type alone
        return None
    return built if built != model_type else None


def _language_model_attention(attention: tuple[str, ...], blocks: tuple[str, ...]) -> tuple[str, ...]:
    """The attention patterns in the MoE blocks' layer stack (``model.language_model.layers.*``), so that a
    vision-language model's vision or audio tower attention is not declared for context parallelism."""
    stacks = {b.split(".*.")[0] for b in blocks if ".*." in b}
    inside = tuple(a for a in attention if any(a.startswith(stack + ".*.") for stack in stacks))
    return inside or attention


def _read_layout(model_type: str) -> ReadLayout:
    """Layout fields read off a tiny meta-device model of ``model_type``, with a summary for the docstring."""
    defaults = Family(name="x", model_types=("x",), version="0", api_version=PLUGIN_API_VERSION)
    fallback = {"moe_block": defaults.moe_block, "router": defaults.router, "experts": defaults.experts, "attention": defaults.attention}
    try:
        from halo_core.hf_config import language_model_class

        lm = language_model_class(model_type)
    except Exception:  # a model type transformers does not know (--allow-unknown-model-type): try the causal-LM class
        lm = None
    if lm is not None and lm.missing:
        note = "- nothing: no class of this model type has a language-model head (see below); the fields are the common-case defaults"
        return ReadLayout(fallback, "?", note, found_moe=False, marked=f"{CANNOT_TRAIN_MARK}: {lm.missing}")
    declared = lm.name if lm is not None else None
    try:
        from halo_core.hf_config import counts_experts
        from halo_core.layout import infer_layout, name_pattern
        from halo_core.tiny import tiny_model

        model = tiny_model(model_type, device="meta", model_class=declared)
    except Exception as exc:  # unknown or custom architectures: keep the common-case defaults
        note = "- nothing: no tiny model (see below); the fields are the common-case defaults, check them"
        marked = f"{NO_TINY_MARK} ({type(exc).__name__}: {exc}); set its size-reducing overrides in ``tiny_config``"
        return ReadLayout(fallback, "?", note, found_moe=False, declared_class=declared, marked=marked)
    inferred = dict(infer_layout(model))
    inferred["attention"] = _language_model_attention(inferred["attention"], inferred["moe_block"])
    layout = {**fallback, **{k: v for k, v in inferred.items() if v}}
    lines = [
        f"- MoE blocks: {', '.join(inferred['moe_block']) or 'none found (fields below are defaults)'}",
        f"- router child: {inferred.get('router', '?')}; experts child: {inferred.get('experts', '?')}",
        f"- attention: {', '.join(inferred['attention']) or 'none found (field below is a default)'}",
    ]
    if declared:
        lines.append(f"- built with `{declared}` ({lm.found}): `AutoModelForCausalLM` does not map this config")
    marked = None
    if not inferred["moe_block"] and counts_experts(model.config):
        looks = list(dict.fromkeys(name_pattern(n) for n, m in model.named_modules() if n and _EXPERT_LIKE.search(type(m).__name__)))
        marked = (f"{NO_MOE_MARK}: the config counts experts, but no module holds fused 3-D expert weights beside a "
                  f"router, nor one called with the interface's arguments{' (expert-like modules: ' + ', '.join(looks[:4]) + ')' if looks else ''}; "
                  f"declare moe_block, router and experts, and implement wrap_moe_block: put the experts at the interface "
                  f"(halo-plugin-llama4), or name their weights and arithmetic to shard_experts (halo-plugin-jetmoe)")
    elif inferred["moe_block"]:
        marked = _experts_the_core_cannot_call(model, layout)
    built = getattr(model.config, "model_type", model_type)
    if built != model_type:
        lines.append(f"- `{type(model).__name__}` builds on the `{built}` part of the config: claimed too")
    replays = not inferred["moe_block"] or _routers_replay(model_type, declared, layout)
    if not replays:
        lines.append("- routers choose experts without `torch.topk`: `routing_replay=False` (GRPO trains it without routing replay)")
    return ReadLayout(layout, type(model).__name__, "\n".join(lines), found_moe=bool(inferred["moe_block"]), declared_class=declared,
                      marked=marked, built_type=built if built != model_type else None, routing_replay=replays)


def _experts_the_core_cannot_call(model, layout: dict) -> str | None:
    """The marked spot where the experts hold fused weights but take neither the interface's arguments nor
    expert-major rows alone (Llama 4's): the core's EP would refuse them at the first layout, so the plugin is
    marked now."""
    from halo_core.layout import find_moe_blocks, has_interface_signature, takes_expert_major_rows

    family = Family(name="x", model_types=("x",), version="0", api_version=PLUGIN_API_VERSION,
                    **{k: layout[k] for k in ("moe_block", "router", "experts")})
    blocks = find_moe_blocks(model, family)
    if not blocks:
        return None
    name, block = blocks[0]
    experts = getattr(block, family.experts)
    if hasattr(type(experts).forward, "__wrapped__") or has_interface_signature(experts) or takes_expert_major_rows(experts):
        return None
    import inspect

    arguments = ", ".join(list(inspect.signature(type(experts).forward).parameters)[1:])
    return (f"{NO_MOE_MARK}: {name}.{family.experts} ({type(experts).__name__}) holds fused expert weights, but its forward "
            f"takes ({arguments}), not the interface's (hidden_states, top_k_index, top_k_weights), so the core cannot "
            f"send it each token's experts; implement wrap_moe_block to put the experts at the interface, as "
            f"halo-plugin-llama4 does for Llama 4's (whose expert-major rows the core also takes)")


def _routers_replay(model_type: str, declared: str | None, layout: dict) -> bool:
    """Whether one forward of a tiny CPU model runs every router through ``torch.topk`` (True where it cannot run:
    the generated test then says why)."""
    import torch

    from halo_core.hf_config import text_config
    from halo_core.rl.routing import silent_routers
    from halo_core.tiny import tiny_model

    try:
        model = tiny_model(model_type, model_class=declared)
        family = Family(name="x", model_types=(model_type,), version="0", api_version=PLUGIN_API_VERSION,
                        **{k: layout[k] for k in ("moe_block", "router", "experts")})
        ids = torch.randint(0, text_config(model.config).vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
        return not silent_routers(model, family, input_ids=ids)
    except Exception:
        return True


#: Class names of modules that hold experts in some layout of their own (``DbrxExperts``, ``JetMoeMoE``).
_EXPERT_LIKE = re.compile(r"Expert|MoE|Moe")


def _literal(value) -> str:
    if isinstance(value, tuple) and len(value) == 1:
        return repr(value[0])
    return repr(value)


def model_type_of(model_dir: Path, given: str | None) -> str:
    """The model type ``model_dir``'s ``config.json`` names (``--model-type``, where also given, must agree)."""
    from halo_core import remote_code

    config = remote_code.config_dict(model_dir) if Path(model_dir).is_dir() else None
    if not config or not isinstance(config.get("model_type"), str):
        raise ScaffoldError(f"--model-dir {model_dir}: no config.json with a model_type there; give the folder that holds the model's config.json")
    if given is not None and given != config["model_type"]:
        raise ScaffoldError(f"--model-type {given!r} disagrees with --model-dir {model_dir}'s config.json ({config['model_type']!r}); drop --model-type")
    return config["model_type"]


@dataclass(frozen=True)
class ShippedCode:
    """A model folder's own modeling code, copied into the plugin, which registers it with transformers."""

    files: tuple[Path, ...]
    #: ``from .module import Class`` lines and the ``register_classes`` call, for the plugin's ``__init__``.
    source: str


def shipped_code(model_dir: Path | None) -> ShippedCode | None:
    """Where ``model_dir`` ships code transformers does not have (``remote_code.ships_code``): its classes registered
    here (the scaffold reads the layout off a tiny model of them: their code runs), and what the plugin needs to
    register its copy wherever it is installed."""
    from halo_core import remote_code

    if model_dir is None:
        return None
    config = remote_code.config_dict(model_dir)
    if not remote_code.ships_code(config):
        return None
    remote_code.register_folder(model_dir, config)
    auto_map = config["auto_map"]
    imports: dict[str, list[str]] = {}
    for reference in [auto_map["AutoConfig"], *(auto_map[a] for a in remote_code.AUTO_CLASSES if a in auto_map)]:
        module, _, cls = reference.split("--")[-1].rpartition(".")
        imports.setdefault(module, []).append(cls)
    lines = [f"from .{module} import {', '.join(dict.fromkeys(classes))}" for module, classes in imports.items()]
    config_class = auto_map["AutoConfig"].rpartition(".")[2]
    models = ", ".join(f"{a!r}: {auto_map[a].rpartition('.')[2]}" for a in remote_code.AUTO_CLASSES if a in auto_map)
    source = ("\n\nfrom halo_core.remote_code import register_classes\n\n" + "\n".join(lines) + "\n\n"
              f"# The model's own code, copied from its folder by `halo new-family --model-dir`: transformers does not know\n"
              f"# {config['model_type']!r}, so the plugin registers these classes (a run with trust_remote_code: true registers\n"
              f"# the model folder's own instead, as transformers prefers trusted remote code).\n"
              f"register_classes({config_class}, {{{models}}})")
    return ShippedCode(tuple(sorted(Path(model_dir).glob("*.py"))), source)


def render_family(name: str, model_type: str, output_dir: Path, *, allow_unknown_model_type: bool = False, replace: str | None = None,
                  model_dir: Path | None = None) -> Scaffold:
    """Write ``output_dir/halo-plugin-<name>/``; refuse before writing anything. ``model_dir``: a model folder whose
    own code (``auto_map``) the plugin ships and registers."""
    names = plugin_names(name)
    target = Path(output_dir) / names.distribution
    if target.exists():
        raise ScaffoldError(f"{target} already exists; choose another --output-dir or remove it first")
    code = shipped_code(model_dir)
    if not allow_unknown_model_type and not _known_model_type(model_type):
        raise ScaffoldError(
            f"model type {model_type!r} is unknown to the installed transformers; check the spelling "
            f"(it is the config's `model_type`), or pass --allow-unknown-model-type for architectures "
            f"that ship their own modeling code"
        )
    model_type, part_of_note = claimed_model_type(model_type)
    read = _read_layout(model_type)
    replaces = replaced_distribution([model_type, *([read.built_type] if read.built_type else [])], replace)
    values = {
        "name": names.family,
        "distribution": names.distribution,
        "package": names.package,
        "model_type": model_type,
        "model_class": read.model_class,
        "found": read.summary,
        "core_version": halo_core.__version__,
        "api_version": repr(PLUGIN_API_VERSION),
        "name_literal": repr(names.family),
        "model_types_literal": ", ".join(repr(t) for t in (model_type, read.built_type) if t) + ("," if not read.built_type else ""),
        "splits_literal": "{'ep'}" if read.found_moe else "",
        "replaces_note": part_of_note + _replaces_note(replaces, model_type),
        "part_of_note": part_of_note,
        "model_class_field": f"\n        model_class={read.declared_class!r}," if read.declared_class else "",
        "routing_replay_field": "" if read.routing_replay else "\n        routing_replay=False,",
        "marked_note": f"{_docstring_safe(read.marked)}.\n\n" if read.marked else "",
        "test_import": "import pytest" if read.marked else "from halo_core.testing import check_family",
        "test_body": f"pytest.fail({read.marked!r})" if read.marked else f"check_family({names.family!r})",
        **{f"{k}_literal": _literal(v) for k, v in read.fields.items()},
        "shipped_code": code.source if code else "",
    }
    template_root = files("halo_cli.templates") / "family"
    _render_tree(template_root, target, values, names.package)
    for file in code.files if code else ():
        (target / names.package / file.name).write_text(file.read_text())
    return Scaffold(target, names.family, replaces)


def _docstring_safe(text: str) -> str:
    return text.replace("\\", "/").replace('"' * 3, "'" * 3)


def _replaces_note(replaces: str | None, model_type: str) -> str:
    if not replaces:
        return ""
    return (f"It is meant to be installed instead of `{replaces}`, which claims `{model_type}` too: "
            f"`pip uninstall {replaces}` first (two plugins claiming one model type both turn broken).\n\n")


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
