"""What each process ``torch.distributed.run`` starts runs: the method's trainer on the run's spec."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from halo_core.parallel.process_exit import finish, forget_parent_exit_handlers
from halo_core.trainers.method import get_method
from halo_core.trainers.run_config import RunConfig


def main(spec: dict) -> None:
    forget_parent_exit_handlers()
    # A forked worker keeps the launcher's thread settings; the ranks share the machine's cores.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    run = RunConfig.from_json(spec)
    get_method(run.method).run(run)
    if dist.is_initialized():
        # Leave together with the process group shut down, as torch asks of every process before exit.
        dist.barrier()
        dist.destroy_process_group()
    finish()  # the exit handlers (trackers, logging) run here: multiprocessing ends the process with ``os._exit``
