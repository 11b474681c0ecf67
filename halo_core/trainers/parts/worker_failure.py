"""A failed run as the launcher reports it.

torchrun's report of a failed worker is a framed table with each rank's traceback. For the errors Halo raises on
purpose inside a running worker to end the run (listed in ``ONE_LINE``), the message itself says what happened and
what to do, so the launcher prints that one line instead; any other failure keeps torchrun's report.
"""

from __future__ import annotations

import logging

from halo_core.parallel.loading import CheckpointError
from halo_core.trainers.parts.collective_timeout import CollectiveTimeout

#: Worker errors shown as their one line (torchrun records a worker's exception as ``"TypeName: message"``):
#: a hung collective, and a checkpoint a rank cannot read (a damaged part names its file and tensor).
ONE_LINE: tuple[type[BaseException], ...] = (CollectiveTimeout, CheckpointError)


def one_line(failure) -> str | None:
    """The message of the earliest ``ONE_LINE`` error among a ``ChildFailedError``'s ranks, or ``None``.

    The earliest of those rather than torchrun's root cause: ranks that fail in the same second (a peer's
    connection closing as the first one leaves) tie with it."""
    names = {kind.__name__ for kind in ONE_LINE}
    found = []
    for process in failure.failures.values():
        recorded = process.message.get("message", "") if isinstance(process.message, dict) else ""
        name, colon, text = recorded.partition(": ")
        if colon and name in names:
            found.append((process.timestamp, text))
    return min(found)[1] if found else None


class QuietOneLine:
    """A ``logging.Filter`` for torchrun's agent: it logs a failed worker's exception with its traceback as it sees it
    fail; for a ``ONE_LINE`` error that repeats the line the launcher prints, under a traceback."""

    def filter(self, record) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or not any(f"{kind.__name__}: " in str(error) for kind in ONE_LINE)


#: The agent's logger of failed workers.
AGENT_LOGGER = "torch.distributed.elastic.multiprocessing.api"


def quiet_agent_log() -> None:
    """Filter the agent's log of failed workers (once per process)."""
    logger = logging.getLogger(AGENT_LOGGER)
    if not any(isinstance(existing, QuietOneLine) for existing in logger.filters):
        logger.addFilter(QuietOneLine())
