"""``halo launch METHOD CONFIG.yaml``: check the whole run, then start it (in-process, or with torch.distributed.run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer
import yaml
from rich.console import Console
from rich.table import Table

from halo_core.errors import ConfigError
from halo_core.trainers.method import get_method
from halo_core.trainers.parts.resume import check_resume
from halo_core.trainers.run_checks import check_run
from halo_core.trainers.run_config import RunConfig, check_layout, load_run_config, parse_overrides

console = Console()


def launch(
    ctx: typer.Context,
    method: Annotated[str, typer.Argument(help="Training method, e.g. sft.")],
    config: Annotated[Path, typer.Argument(help="The run's YAML file.")],
    nproc: Annotated[int, typer.Option("--nproc", min=1, help="Processes on this machine (one per GPU).")] = 1,
    nnodes: Annotated[int, typer.Option("--nnodes", min=1, help="Machines in the run.")] = 1,
    node_rank: Annotated[int, typer.Option("--node-rank", min=0, help="This machine's index among --nnodes.")] = 0,
    rdzv_endpoint: Annotated[Optional[str], typer.Option("--rdzv-endpoint", help="HOST:PORT of the rendezvous (multi-node).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the resolved config, the layout and the families, then exit.")] = False,
) -> None:
    """Train with METHOD as CONFIG says; fields after `--` override the file (`-- --max_steps=10`)."""
    if nnodes > 1 and not rdzv_endpoint:
        raise ConfigError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node) so the nodes can meet")
    if node_rank >= nnodes:
        raise ConfigError(f"--node-rank {node_rank} must be below --nnodes {nnodes} (nodes are numbered 0..{nnodes - 1})")
    chosen = get_method(method)
    run = load_run_config(method, chosen.config_class, config, parse_overrides(list(ctx.args)))
    world = nproc * nnodes
    check_run(run, world)
    layout = check_layout(run, world)
    check_resume(run)
    if dry_run:
        _print_plan(run, layout, world)
        return
    if world == 1:
        chosen.run(run)
        return
    raise typer.Exit(_torchrun(run, nproc, nnodes, node_rank, rdzv_endpoint))


def _print_plan(run: RunConfig, layout: dict, world: int) -> None:
    console.print("[bold]resolved config[/]")
    console.print(yaml.safe_dump(run.to_json(), sort_keys=False))
    dims = layout["dims"]
    family = layout["family"] or "none (plain FSDP2 route)"
    console.print(f"[bold]model type[/]: {layout['model_type']}   [bold]family[/]: {family}")
    table = Table(title=f"layout: world {world} = dp {dims.dp} x cp {dims.cp} x tp {dims.tp}; ep {dims.ep} x etp {dims.etp} within dp")
    for column in ("rank", "dp", "ep", "ep_replica", "cp", "tp", "etp"):
        table.add_column(column)
    for rank in range(world):
        coords = dims.coordinates(rank)
        table.add_row(str(rank), *(str(coords[c]) for c in ("dp", "ep", "ep_replica", "cp", "tp", "etp")))
    console.print(table)


def _torchrun(run: RunConfig, nproc: int, nnodes: int, node_rank: int, rdzv_endpoint: str | None) -> int:
    # The run's spec lives as long as the workers that read it, however the launch ends (failure, Ctrl-C); so do
    # torchrun's per-rank log folders (empty unless a rank fails, whose error torchrun prints before it returns).
    with tempfile.TemporaryDirectory(prefix="halo-run-") as folder:
        spec = Path(folder) / "run.json"
        spec.write_text(json.dumps(run.to_json()))
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--nnodes={nnodes}", f"--log-dir={folder}/torchrun"]
        if nnodes == 1 and rdzv_endpoint is None:
            command.append("--standalone")
        else:
            command += [f"--node-rank={node_rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}"]
        command += ["-m", "halo_core.trainers.worker", str(spec)]
        return subprocess.call(command, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
