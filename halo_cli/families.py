"""``halo families list|show|matrix``: the support matrix, built from the plugins that are installed; ``contract``: the hook reference."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from halo_core.family import SPLITS
from halo_core.matrix import SPLIT_ORDER as _SPLIT_ORDER, split_marks
from halo_core.registry import PluginRecord, Registry, discover, strict_from_env

app = typer.Typer(help="Model families: installed plugins and what they support.", no_args_is_help=True)
console = Console()

UNCLAIMED_FOOTER = "Model types no plugin claims (dense Llama, Qwen3, ...) train through the plain FSDP2 route."


@app.command("list")
def list_families(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit non-zero if any plugin is broken (also HALO_STRICT_PLUGINS=1).")] = False,
) -> None:
    """One row per installed family plugin: model types, splits, status."""
    registry = discover(strict=False)
    if as_json:
        typer.echo(json.dumps([r.as_json() for r in registry.records], indent=2))
    else:
        table = _table(registry)
        out = console
        if not console.is_terminal:  # a log or a pipe: as wide as the table, so no name is cut to "cohere2…"
            widest = Measurement.get(console, console.options.update_width(10_000), table).maximum
            out = Console(width=max(console.width, widest))
        out.print(table)
        out.print(UNCLAIMED_FOOTER, style="dim")
    if (strict or strict_from_env()) and registry.broken:
        names = ", ".join(r.name for r in registry.broken)
        typer.echo(f"strict mode: broken plugins: {names}", err=True)
        raise typer.Exit(1)


def _table(registry: Registry) -> Table:
    table = Table(title="Halo model families")
    for column in ("family", "distribution", "version", "model types", *(s.upper() for s in _SPLIT_ORDER), "status"):
        table.add_column(column)
    for record in registry.records:
        row = record.as_json()
        marks = split_marks(registry, record, quote="") if record.ok else ["-"] * len(_SPLIT_ORDER)
        status = "[green]ok[/]" if record.ok else f"[red]broken[/]: {row['error']}"
        table.add_row(row["name"], row["distribution"], row["version"], ", ".join(row["model_types"]), *marks, status)
    if not registry.records:
        table.caption = "no family plugins installed"
    return table


@app.command("matrix")
def matrix(
    write: Annotated[Optional[Path], typer.Option("--write", help="Write the Markdown page here instead of printing it.")] = None,
) -> None:
    """The support matrix as Markdown (agent-docs/models/index.md is this command's output)."""
    from halo_core.matrix import render

    page = render(discover(strict=False))
    if write:
        write.parent.mkdir(parents=True, exist_ok=True)
        write.write_text(page)
    else:
        typer.echo(page, nl=False)


@app.command("contract")
def contract(
    write: Annotated[Optional[Path], typer.Option("--write", help="Rewrite the marked sections of this page instead of printing them.")] = None,
) -> None:
    """The plugin contract's reference from the code (agent-docs/plugin-contract.md holds it between markers)."""
    from halo_core.contract_doc import render, update_page

    if write:
        write.write_text(update_page(write.read_text()))
    else:
        typer.echo(render(), nl=False)


@app.command("show")
def show_family(
    name: Annotated[str, typer.Argument(help="Family name as in `halo families list`.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Details of one family, and the module paths its hooks would wrap in a tiny model of each type."""
    registry = discover(strict=False)
    record = registry.by_name(name)  # UnknownFamilyError lists the known names; main() exits 2
    details = _details(registry, record)
    if as_json:
        typer.echo(json.dumps(details, indent=2))
        return
    for key in ("name", "distribution", "version", "status", "error", "model_types", "splits", "hooks_implemented", "declared"):
        if details.get(key) is not None:
            console.print(f"[bold]{key}[/]: {details[key]}")
    for model_type, wrapped in details.get("wrapped", {}).items():
        console.print(f"[bold]{model_type}[/] (tiny random config):")
        for hook, paths in wrapped.items():
            console.print(f"  {hook}: {', '.join(paths) if isinstance(paths, list) else paths}")


def _details(registry: Registry, record: PluginRecord) -> dict:
    details = record.as_json()
    if not record.ok:
        return details
    family = record.family
    details["hooks_implemented"] = registry.overridden_hooks(record)
    details["declared"] = {
        "moe_block": list(family.moe_block),
        "router": family.router,
        "experts": family.experts,
        "attention": list(family.attention),
    }
    details["wrapped"] = {t: _wrapped_paths(registry, record, t) for t in family.model_types}
    details["splits"] = sorted(set().union(*(registry.supported_splits(record, t) for t in family.model_types)) & SPLITS)
    return details


def _wrapped_paths(registry: Registry, record: PluginRecord, model_type: str) -> dict:
    from halo_core.layout import find_attention, find_moe_blocks
    from halo_core.tiny import tiny_family_model

    try:
        model = tiny_family_model(record.family, model_type, device="meta")
    except Exception as exc:
        return {"error": f"could not build a tiny {model_type} model: {type(exc).__name__}: {exc}"}
    return {
        "wrap_moe_block": [n for n, _ in find_moe_blocks(model, record.family)],
        "wrap_attention": [n for n, _ in find_attention(model, record.family)],
        "shard_tp": [type(model).__name__],
        "supported_splits": sorted(registry.supported_splits(record, model_type)),
    }
