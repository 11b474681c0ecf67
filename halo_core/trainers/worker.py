"""Entry of each process ``torch.distributed.run`` starts: ``python -m halo_core.trainers.worker RUN.json``."""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

from halo_core.parallel.process_exit import leave
from halo_core.trainers.method import get_method
from halo_core.trainers.run_config import RunConfig


def main(path: str) -> None:
    run = RunConfig.from_json(json.loads(open(path).read()))
    get_method(run.method).run(run)
    if dist.is_initialized():
        # Leave together with the process group shut down, as torch asks of every process before exit.
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    leave(0)
