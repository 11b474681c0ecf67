"""The global batch a run trains at, recorded in every checkpoint and kept when it resumes on another world size.

The global batch (samples per optimizer step) is ``per_device_train_batch_size x gradient_accumulation_steps x`` the
processes: every process draws its own samples, and the ranks of a CP x TP group pool theirs (``parts/context.py``),
so a group of ``cp * tp`` ranks trains ``cp * tp`` per-device batches. Resumed on another number of processes with the
same keys, a run would silently train at another global batch, another run than the one it continues (a run saved at
``--nproc 2`` and resumed at ``--nproc 1`` ended at loss 0.54 instead of 0.46).

So rank 0 writes ``halo-run.json`` (plain JSON: the global batch and the three numbers it came from) into each
checkpoint, and the launcher, before start, keeps the stored global batch: it sets ``gradient_accumulation_steps``
where the stored global batch is a multiple of the per-device batch times the processes, and refuses otherwise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from halo_core.errors import ConfigError
from halo_core.trainers.run_plan import RunPlan

RECORD = "halo-run.json"
ACCUMULATION = "gradient_accumulation_steps"
BATCH = "per_device_train_batch_size"


def record(trainer, folder: str) -> None:
    """Write the run's global batch into the checkpoint ``folder`` being assembled (the process that saves)."""
    if not trainer.args.should_save:
        return
    args = trainer.args
    numbers = {BATCH: args.per_device_train_batch_size, ACCUMULATION: args.gradient_accumulation_steps, "processes": args.world_size}
    data = {"global_batch": numbers[BATCH] * numbers[ACCUMULATION] * numbers["processes"], **numbers}
    with open(os.path.join(folder, RECORD), "w") as file:
        json.dump(data, file, indent=2)


def keep(run, world: int, plan: RunPlan | None = None) -> None:
    """Before start: a resumed run keeps the global batch its checkpoint trained at (``run.trainer`` corrected, and one
    line saying so), or is refused with the arithmetic. Nothing changes where the batch keys already keep it.

    ``plan``: the launch's ``RunPlan``, whose method config is read; where this changes ``gradient_accumulation_steps``
    the plan's method config is built again, the one rebuild of a launch: the config checks the new value itself
    (GRPO's generation batch) and the checks after this one must see the config the workers will build."""
    folder = run.trainer.get("resume_from_checkpoint")  # resolved to a checkpoint folder by check_resume
    if not folder:
        return
    name = Path(folder).name
    path = Path(folder) / RECORD
    if not path.is_file():
        print(f"resuming {name}: it records no global batch (no {RECORD}: saved by a Halo from before checkpoints recorded it), so it is not checked; "
              f"{BATCH} x {ACCUMULATION} x {world} process(es) must equal the batch it was saved at for the run to continue as it was",
              flush=True)
        return
    try:
        stored = json.loads(path.read_text())
        saved = int(stored["global_batch"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{run.source}: resume_from_checkpoint: {path} is not readable ({exc}); delete it to resume without the global batch check") from None
    plan = plan if plan is not None else RunPlan(run, world)
    args = plan.args
    batch, steps = args.per_device_train_batch_size, args.gradient_accumulation_steps
    if batch * steps * world == saved:
        return
    if saved % (batch * world) == 0:
        run.trainer[ACCUMULATION] = saved // (batch * world)
        plan.rebuild_args()  # the method's config takes the new value (GRPO's generation batch), or refuses it by name
        print(f"resuming {name} at global batch {saved} (saved so): {ACCUMULATION} {steps} -> {run.trainer[ACCUMULATION]} "
              f"for {world} process(es) x {BATCH} {batch}", flush=True)
        return
    came_from = " x ".join(f"{stored.get(key, '?')}" for key in (BATCH, ACCUMULATION, "processes"))
    raise ConfigError(
        f"{run.source}: resume_from_checkpoint {name} trained at global batch {saved} ({BATCH} x {ACCUMULATION} x processes = "
        f"{came_from}), and {world} process(es) x {BATCH} {batch} = {batch * world} does not divide it; {_fix(saved, world, batch)}"
    )


def _fix(saved: int, world: int, batch: int) -> str:
    """What to set so that ``BATCH x ACCUMULATION x world`` is ``saved``, or why nothing can."""
    if saved % world:
        return f"no batch keys can on {world} processes ({saved} is not a multiple of {world}): launch on a number of processes that divides {saved}"
    per_process = saved // world
    fitting = max(b for b in range(1, min(batch, per_process) + 1) if per_process % b == 0)
    return (f"set {BATCH} x {ACCUMULATION} = {per_process} (e.g. -- --{BATCH}={fitting} --{ACCUMULATION}={per_process // fitting}) "
            f"to continue at global batch {saved}")
