"""Entry point of the ``halo`` command: sub-commands are registered here, each in its own module."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

import halo_core
from halo_cli import families, methods
from halo_cli.launch import launch
from halo_cli.plan import plan
from halo_cli import wheels
from halo_cli.export import export
from halo_core.errors import HaloError

_typer_app = typer.Typer(
    help="Halo: distributed post-training for unmodified Hugging Face models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
_typer_app.add_typer(families.app, name="families")
_typer_app.add_typer(methods.app, name="methods")
_typer_app.command("launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(launch)
_typer_app.command("plan", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(plan)
_typer_app.command("build-wheels")(wheels.command)
_typer_app.command("export")(export)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"halo {halo_core.__version__}")
        raise typer.Exit()


@_typer_app.callback()
def _root(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")] = None,
) -> None:
    """Halo: distributed post-training for unmodified Hugging Face models."""


@_typer_app.command("new-family")
def new_family(
    name: Annotated[str, typer.Argument(help="Family name, e.g. 'my-moe'; the package becomes halo_plugin_my_moe.")],
    model_type: Annotated[Optional[str], typer.Option("--model-type", help="transformers model type the family claims (config.model_type).")] = None,
    model_dir: Annotated[Optional[Path], typer.Option("--model-dir", help="A model folder: its config's model type; where the folder ships its own modeling code (auto_map), that code runs and is copied into the plugin.")] = None,
    output_dir: Annotated[Path, typer.Option("--output-dir", help="Folder to create halo-plugin-NAME/ in.")] = Path("."),
    allow_unknown_model_type: Annotated[bool, typer.Option("--allow-unknown-model-type", help="Accept a model type transformers does not know (custom modeling code).")] = False,
    replace: Annotated[Optional[str], typer.Option("--replace", help="Installed plugin that claims TYPE; the new one is meant to be installed instead of it.")] = None,
) -> None:
    """Scaffold an installable family plugin with its conformance test."""
    from halo_cli.scaffold import render_family

    from halo_cli.scaffold import model_type_of

    if model_dir is not None:
        model_type = model_type_of(model_dir, model_type)
    elif model_type is None:
        raise HaloError("new-family needs --model-type TYPE (the config's model_type) or --model-dir DIR (a model folder with config.json)")
    scaffold = render_family(name, model_type, output_dir, allow_unknown_model_type=allow_unknown_model_type, replace=replace, model_dir=model_dir)
    typer.echo(f"created {scaffold.path}\nnext: {scaffold.next_steps()}")


def app() -> None:
    """Run the CLI; Halo's own errors print as one clear line and exit 2 instead of a traceback."""
    try:
        _typer_app()  # standalone: usage errors already exit 2 with typer's message
    except HaloError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise SystemExit(2)
