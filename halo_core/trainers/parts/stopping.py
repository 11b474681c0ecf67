"""A run that stops on purpose, decided on every rank together: one line for the user, not a traceback from each rank.

``RunStopped`` is raised where every rank reaches the same verdict at the same point (a reduced flag: a non-finite
step, a non-finite checkpoint). A worker writes its message to the file the launcher named (``REPORT``) and exits with
``EXIT_CODE``; the launcher, once every worker is gone, prints that message as its one line instead of torch's
``ChildFailedError`` report (each rank's traceback). The launcher prints it rather than rank 0 because torchrun's agent
ends the other workers as soon as it sees one fail: a rank 0 that lags behind would be ended before it printed.
With one process the launcher catches the error itself.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from halo_core.errors import HaloError

#: A worker's exit status after it stopped with a ``RunStopped`` (its message left in ``REPORT``).
EXIT_CODE = 3
#: Environment variable naming the file a worker leaves its message in (set by the launcher, inherited by the workers).
REPORT = "HALO_STOP_REPORT"


class RunStopped(HaloError):
    """Raised on every rank together; the message names the step and the reason."""


def say(message: str) -> None:
    """The one line, as the CLI prints its errors."""
    print(f"error: {message}", file=sys.stderr, flush=True)


def leave(stopped: RunStopped) -> None:
    """In a worker: leave the message for the launcher, then exit with ``EXIT_CODE`` (quietly: ``SystemExit`` is no
    error to torch's worker wrapper or to multiprocessing). Every rank writes the same message; a rename keeps the file
    whole whichever writes last. Without a launcher's file, rank 0 prints it."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    target = os.environ.get(REPORT)
    if target:
        partial = Path(f"{target}.{rank}")
        partial.write_text(str(stopped))
        os.replace(partial, target)
    elif rank == 0:
        say(str(stopped))
    sys.stdout.flush()
    raise SystemExit(EXIT_CODE)


def reported(failure, report: Path) -> str | None:
    """The message the workers left, if they stopped with a ``RunStopped`` and the rest were only ended by the agent
    afterwards (a negative exit code: killed by a signal); ``None`` if some worker failed otherwise."""
    codes = [f.exitcode for f in failure.failures.values()]
    if not report.is_file() or not all(code == EXIT_CODE or code < 0 for code in codes):
        return None
    return report.read_text()
