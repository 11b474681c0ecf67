"""``halo launch METHOD CONFIG.yaml``: check the whole run, then start it (in-process, or with torch.distributed.run)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Annotated, Optional

import typer
import yaml
from rich.console import Console
from rich.table import Table

from halo_core import remote_code
from halo_core.errors import ConfigError
from halo_core.trainers.method import get_method
from halo_core.trainers.parts.integrity import check_model
from halo_core.trainers.parts import output_room, restart, stopping
from halo_core.trainers.parts.global_batch import keep as keep_global_batch
from halo_core.trainers.parts.resume import check_resume
from halo_core.trainers.run_checks import check_run
from halo_core.trainers.run_config import RunConfig, check_layout, load_run_config, parse_overrides
from halo_core.trainers.run_plan import RunPlan

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
    remote_code.admit(run)  # before anything reads the model's config: transformers would ask on stdin
    world = nproc * nnodes
    plan = check_run(run, world)  # the run's one RunPlan: method config, model config, layout, each resolved once
    plan.layout = layout = check_layout(run, world, run_plan=plan)
    from halo_core.trainers.parts import moe_bias, nonfinite  # imports torch: here, not for every halo command

    nonfinite.check_key(run)
    moe_bias.check_key(run)
    asked_latest = run.trainer.get(restart.RESUME) is True
    check_resume(run)
    check_model(run)
    keep_global_batch(run, world, plan)
    restart.check_output_dir(run)
    output_room.check_output_dir(run, world, plan)
    resuming = restart.resuming_line(run, asked_latest)
    if resuming:
        console.print(resuming, markup=False, highlight=False, soft_wrap=True)
    if dry_run:
        _print_plan(run, layout, world)
        return
    launcher_args = [method, str(config), "--nproc", str(nproc)]
    if nnodes > 1:
        launcher_args += ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--rdzv-endpoint", str(rdzv_endpoint)]
    raise typer.Exit(_train(plan, chosen, launcher_args, list(ctx.args), nproc, nnodes, node_rank, rdzv_endpoint))


def _train(plan: RunPlan, chosen, launcher_args: list[str], overrides: list[str], *where) -> int:
    """Train (in this process, or in workers), ending an interrupt (Ctrl-C: SIGINT to the process group; or SIGTERM)
    with one line naming the last complete checkpoint and the command that resumes it, exit 128 + the signal's number,
    instead of the launcher's traceback."""
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException

    def terminated(signum, frame):  # as torchrun's agent turns SIGTERM into an exception where workers run
        raise SignalException(f"got {signal.Signals(signum).name}", sigval=signal.Signals(signum))

    run = plan.run
    try:
        if plan.world == 1:
            from halo_core.trainers.worker import _quiet_trl_aliases

            signal.signal(signal.SIGTERM, terminated)
            _quiet_trl_aliases()  # as a worker does: TRL's calls of transformers' deprecated aliases, one process too
            chosen.run(run)
            return 0
        return _torchrun(plan, *where)
    except stopping.RunStopped as stopped:  # one process: the line the workers would have left the launcher
        _close_progress_bars()
        stopping.say(str(stopped))
        return 1
    except (KeyboardInterrupt, SignalException) as interrupt:
        number = getattr(interrupt, "sigval", signal.SIGINT)
        _close_progress_bars()
        sys.stdout.flush()
        print(restart.interrupted_line(run, launcher_args, overrides, signal.Signals(number).name), file=sys.stderr, flush=True)
        return 128 + int(number)


def _close_progress_bars() -> None:
    """With one process the trainer's progress bar is still open when training ends by an exception, and would redraw
    itself after the launcher's last line."""
    from tqdm import tqdm

    for bar in list(tqdm._instances):  # noqa: SLF001
        bar.close()


def _print_plan(run: RunConfig, layout: dict, world: int) -> None:
    console.print("[bold]resolved config[/]")
    console.print(yaml.safe_dump(run.to_json(), sort_keys=False), soft_wrap=True, markup=False, highlight=False)  # paths stay whole
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


def _torchrun(plan: RunPlan, nproc: int, nnodes: int, node_rank: int, rdzv_endpoint: str | None) -> int:
    """Start the workers with ``torch.distributed.run``'s own launcher (its arguments, rendezvous and agent), this
    process as the agent. On a machine without CUDA the workers are forked from it, so they start with everything the
    checks above imported (an import of torch, transformers and TRL is 5 s of CPU a process); where CUDA is in play
    they come from a fork server that imports the worker once, as forking a process that has asked CUDA anything is
    not safe."""
    import torch
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, get_args_parser

    from halo_core.trainers import worker

    # torchrun's per-rank log folders live as long as the launch, however it ends (failure, Ctrl-C): empty unless a
    # rank fails, whose error is printed before the launch returns.
    with tempfile.TemporaryDirectory(prefix="halo-run-") as folder:
        args = [f"--nproc-per-node={nproc}", f"--nnodes={nnodes}", f"--log-dir={folder}/torchrun"]
        if nnodes == 1 and rdzv_endpoint is None:  # what ``--standalone`` resolves to
            args += ["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", f"--rdzv-id={uuid.uuid4()}"]
        else:
            args += [f"--node-rank={node_rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}"]
        method = "forkserver" if torch.cuda.is_available() else "fork"
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for several ranks, without its banner
        config, _, _ = config_from_args(get_args_parser().parse_args([*args, f"--start-method={method}", "halo-worker"]))
        if method == "forkserver":
            multiprocessing.set_forkserver_preload([worker.__name__, get_method(plan.run.method).run.__module__])
        report = Path(folder) / "stopped"
        os.environ[stopping.REPORT] = str(report)  # where a worker stopping on purpose leaves its one line (parts.stopping)
        sys.stdout.flush()
        sys.stderr.flush()
        from halo_core.trainers.parts import worker_failure

        worker_failure.quiet_agent_log()  # a worker's one-line error is not repeated under its traceback
        try:
            with _quiet_shutdown():
                elastic_launch(config, worker.main)(plan.to_json())  # the checked plan, as plain JSON
        except ChildFailedError as failure:
            message = stopping.reported(failure, report)
            if message is not None:
                stopping.say(message)
            else:
                line = worker_failure.one_line(failure)
                print(f"error: {line}" if line else failure.format_msg(), file=sys.stderr)
            return 1
        finally:
            os.environ.pop(stopping.REPORT, None)
        return 0


#: What torchrun's agent logs as it ends the workers (after an interrupt, or after a worker stopped on purpose with its
#: own line, ``stopping.EXIT_CODE``); the launcher's own line says what happened. A worker's real failure still shows.
_SHUTDOWN_NOISE = {
    "torch.distributed.elastic.agent.server.api": lambda r: r.msg == "Received %s death signal, shutting down workers",
    "torch.distributed.elastic.multiprocessing.api": lambda r: r.msg == "Closing process %s via signal %s"
    or (str(r.msg).startswith("failed (exitcode: %s)") and bool(r.args) and r.args[0] == stopping.EXIT_CODE),
}


@contextlib.contextmanager
def _quiet_shutdown():
    import logging

    def drop(record: logging.LogRecord) -> bool:
        noise = _SHUTDOWN_NOISE.get(record.name)
        return not (noise and noise(record))

    loggers = [logging.getLogger(name) for name in _SHUTDOWN_NOISE]
    for logger in loggers:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)
