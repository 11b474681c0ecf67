"""What each process ``torch.distributed.run`` starts runs: the method's trainer on the run's spec."""

from __future__ import annotations

import os
import signal
import warnings

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.api import SignalException

from halo_core import remote_code
from halo_core.parallel.process_exit import finish, forget_parent_exit_handlers
from halo_core.trainers.method import get_method
from halo_core.trainers.parts import stopping
from halo_core.trainers.run_plan import RunPlan


def main(spec: dict) -> None:
    """``spec``: the launcher's ``RunPlan.to_json()``, the run it checked for this world (rebuilt here, not re-derived)."""
    forget_parent_exit_handlers()
    # A forked worker keeps the launcher's thread settings; the ranks share the machine's cores.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    plan = RunPlan.from_json(spec)
    plan.check_world()  # torchrun started the world the launcher checked the run for
    run = plan.run
    remote_code.admit(run)  # a worker started afresh (forkserver) has not registered the model's own classes
    _interrupt_once()
    _quiet_trl_aliases()
    try:
        get_method(run.method).run(run)
    except stopping.RunStopped as stopped:
        stopping.leave(stopped)  # the launcher prints its one line
    except (KeyboardInterrupt, SignalException):
        # The launcher says where to resume; a traceback from each rank would only bury that line.
        raise SystemExit(130) from None
    if dist.is_initialized():
        # Leave together with the process group shut down, as torch asks of every process before exit.
        dist.barrier()
        dist.destroy_process_group()
    finish()  # the exit handlers (trackers, logging) run here: multiprocessing ends the process with ``os._exit``


def _quiet_trl_aliases() -> None:
    """TRL's ``disable_gradient_checkpointing`` (DPO, KTO and GRPO score with the policy under it) calls transformers
    5's deprecated ``is_gradient_checkpointing``, ``gradient_checkpointing_disable`` and ``gradient_checkpointing_enable``,
    each a FutureWarning on every rank and call. They are transformers' own aliases of the ``activation_checkpointing``
    ones and do the same; the warning is for TRL's authors, not a run's user. Only these three names are filtered."""
    warnings.filterwarnings("ignore", message=r"`(is_gradient_checkpointing|gradient_checkpointing_(enable|disable))` is deprecated",
                            category=FutureWarning)


def _interrupt_once() -> None:
    """Ctrl-C reaches a worker twice: from the terminal (the whole process group) and from torchrun's agent passing it
    on. The first ends the worker; a second, arriving while it unwinds, would be raised inside some destructor (a
    progress bar's), which Python reports with a traceback: so after the first, the worker ignores the rest (the
    agent still kills a worker that does not end in its time). SIGTERM, how the agent ends the others when one fails,
    likewise."""
    def interrupted(signum, frame):
        for each in (signal.SIGINT, signal.SIGTERM):
            signal.signal(each, signal.SIG_IGN)
        raise KeyboardInterrupt

    for each in (signal.SIGINT, signal.SIGTERM):
        signal.signal(each, interrupted)
