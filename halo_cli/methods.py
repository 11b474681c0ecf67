"""``halo methods matrix``: the method x split matrix, built from the installed ``halo.methods`` entry points."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(help="Training methods: what each trains on and the splits it declares.", no_args_is_help=True)


@app.command("matrix")
def matrix(
    write: Annotated[Optional[Path], typer.Option("--write", help="Write the Markdown page here instead of printing it.")] = None,
) -> None:
    """The method x split matrix as Markdown (agent-docs/methods/index.md is this command's output)."""
    from halo_core.matrix import render_methods

    page = render_methods()
    if write:
        write.parent.mkdir(parents=True, exist_ok=True)
        write.write_text(page)
    else:
        typer.echo(page, nl=False)
