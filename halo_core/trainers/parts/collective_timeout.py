"""``ddp_timeout`` (transformers' key, seconds) for every collective, and a collective that times out ending the
run with one line naming the step.

Halo joins the process group itself (``runtime.init_distributed``), before the method's arguments exist, so
transformers never applied ``ddp_timeout``: a frozen rank held every other one in its collective for torch's
default (30 minutes on gloo), silently. The groups created later (the layout's DeviceMesh dimensions, FSDP2's
flattened meshes, GRPO's gloo side group) take torch's default timeout, not the world group's, so that default is
set too.

What the backend says when a collective times out: gloo (torch 2.13) "Timed out waiting Nms for recv (or send)
operation to complete", naming no rank, for every collective tried (all_reduce, barrier, all_gather,
reduce_scatter, all_to_all, broadcast, recv, all_gather_object); the line then names the rank that waited, not the
one it waited for. On NCCL the watchdog thread ends the process itself (``TORCH_NCCL_ASYNC_ERROR_HANDLING``), and
this line is not reached: ``agent-docs/troubleshooting.md``.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from halo_core.errors import HaloError

FIELD = "ddp_timeout"
#: What the backends' errors say when a collective did not complete in the group's timeout: gloo's transport,
#: NCCL's watchdog and blocking wait (``TORCH_NCCL_BLOCKING_WAIT=1``, where the main thread sees it).
MARKERS = ("Timed out waiting", "Watchdog caught collective operation timeout", "timed out in blocking wait")


class CollectiveTimeout(HaloError):
    """A collective did not complete within ``ddp_timeout``: some rank stopped taking part."""


def seconds(run, config_class) -> float:
    """The run's ``ddp_timeout``, or the method config's default (transformers': 1800 s)."""
    if FIELD in run.trainer:
        return float(run.trainer[FIELD])
    default = next((f.default for f in dataclasses.fields(config_class) if f.name == FIELD), 1800)
    return float(default)


def apply_to_new_groups(timeout: timedelta) -> None:
    """Groups created from now on without a timeout of their own (``new_group``'s default, which DeviceMesh and
    FSDP2 use) wait ``timeout`` rather than torch's backend default. torch reads these module attributes at each
    ``new_group``; there is no other switch for groups that library code creates."""
    from torch.distributed import distributed_c10d

    distributed_c10d.default_pg_timeout = timeout
    distributed_c10d.default_pg_nccl_timeout = timeout


def timed_out(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from or during, is a backend's collective timeout."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, RuntimeError) and any(marker in str(error) for marker in MARKERS):
            return True
        error = error.__cause__ or error.__context__
    return False


class Watch:
    """Around a worker's run: a collective timeout becomes ``CollectiveTimeout``, one line naming this rank and the
    trainer's global step (set ``trainer`` once it exists). Anything else passes through unchanged."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.trainer = None

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if error is None or not timed_out(error):
            return False
        raise CollectiveTimeout(self.message()) from None

    def message(self) -> str:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        if self.trainer is None:
            when = "before training started"
        else:
            step = self.trainer.state.global_step
            when = f"at global step {step} (in step {step + 1} or its logging or save)"
        return (f"rank {rank}: a collective did not complete within {FIELD}={self.timeout_s:g} s {when}: another rank "
                f"stopped taking part (frozen, died or stuck), and the run was stopped; look at the other ranks' output, "
                f"or raise {FIELD} if a step, save or evaluation can take that long")
