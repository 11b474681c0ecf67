"""Run a function on ``world`` spawned CPU ranks joined by a gloo process group: real collectives, no mocks."""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

from halo_core.parallel.process_exit import forget_parent_exit_handlers, leave


#: Longer than any rank waits for a slower one in the kits (a compile, a float64 reference) on a loaded 2-core machine.
COLLECTIVE_TIMEOUT = timedelta(minutes=5)
#: What every rank imports anyway, imported once by the fork server.
PRELOAD = ["torch.distributed.fsdp", "transformers.modeling_utils", "halo_core.parallel", "halo_core.testing.equivalence"]


def spawn(fn: Callable[..., Any], world: int, *args: Any, what: str = "") -> None:
    """Call ``fn(rank, world, *args)`` on every rank (``fn`` must be importable by name).

    A failure raises ``AssertionError`` carrying the first rank's own traceback, not a
    peer's report that the connection dropped.
    """
    # Ranks come from a fork server that has imported torch, transformers and the kit once (5 s of CPU a process
    # otherwise): it starts with the first call and serves every later one in this process. A rank takes the caller's
    # environment as it is now, as a spawned one would, not the server's from when it started.
    multiprocessing.set_forkserver_preload(PRELOAD)
    with tempfile.TemporaryDirectory() as errors:
        try:
            mp.start_processes(_rank_main, args=(world, errors, fn, args, dict(os.environ)), nprocs=world, join=True, start_method="forkserver")
        except ProcessException:
            raise AssertionError(f"{what or fn.__name__} at world {world}: {_root_cause(Path(errors))}") from None


def _root_cause(errors: Path) -> str:
    reports = [p.read_text() for p in sorted(errors.glob("rank*.txt"))]
    causes = [r for r in reports if "Connection closed by peer" not in r] or reports
    if causes:
        return causes[0]
    faults = [p.read_text() for p in sorted(errors.glob("fault*.txt")) if p.stat().st_size]
    return "a rank crashed in native code; its Python stacks:\n" + faults[0] if faults else (
        "a rank died without a Python exception (killed, or out of memory)"
    )


def _rank_main(rank: int, world: int, errors: str, fn: Callable[..., Any], args: tuple, environ: dict) -> None:
    forget_parent_exit_handlers()
    os.environ.clear()
    os.environ.update(environ)
    torch.set_num_threads(1)  # ranks share the machine's cores
    faults = open(Path(errors, f"fault{rank:03d}.txt"), "w")  # a native crash (abort, segfault) still says where
    faulthandler.enable(faults, all_threads=True)
    try:
        # A file store needs no free port (a port picked in advance can be taken before the ranks bind it). A
        # collective one rank never joins fails after COLLECTIVE_TIMEOUT, naming it, instead of hanging the suite.
        dist.init_process_group("gloo", init_method=f"file://{errors}/store", rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
        fn(rank, world, *args)
        dist.barrier()
    except BaseException:
        Path(errors, f"rank{rank:03d}.txt").write_text(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    faulthandler.disable()
    faults.close()
    leave(0)
