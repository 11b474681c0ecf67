"""``halo export --merge RUN_DIR OUT_DIR``: a LoRA run's adapter merged into its base, as a plain HF checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from halo_core.errors import ConfigError


def export(
    run_dir: Annotated[Path, typer.Argument(help="A LoRA run's output_dir (or one of its checkpoint-N folders).")],
    out_dir: Annotated[Path, typer.Argument(help="Where to write the merged model.")],
    merge: Annotated[bool, typer.Option("--merge", help="Merge the adapter into its base (the only export so far).")] = False,
) -> None:
    """Write RUN_DIR's adapter merged into its base model to OUT_DIR (loads with from_pretrained)."""
    if not merge:
        raise ConfigError("halo export writes a merged model only: add --merge (halo export --merge RUN_DIR OUT_DIR)")
    from halo_core.lora.merge import merge as merge_adapter

    typer.echo(f"merged {run_dir} into {merge_adapter(run_dir, out_dir)}")
