"""A finished rank leaves without the interpreter's native teardown.

A rank that has finished (results saved, process group destroyed) can still abort in native
code while the interpreter tears down: "terminate called without an active exception" (a C++
thread object destroyed while still joinable) or "Fatal Python error: Aborted" with no Python
frame, failing a run that succeeded. The cause is not confirmed; torch reports a likely one,
Gloo's worker threads still holding tensors at teardown (pytorch/pytorch#179291).

So once a rank is done, it does itself what Python's exit does at the Python level: it stops
executors' workers and joins the threads that would be waited for, runs the exit handlers
(logging, experiment trackers), and flushes its streams. Then it leaves before C++ objects
are destroyed at interpreter exit, which is where the abort happens.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def forget_parent_exit_handlers() -> None:
    """First thing in a forked child: the exit handlers it inherited are its parent's (a ``weakref.finalize`` of the
    parent's temporary folder among them, which would delete it from under the parent), not its own."""
    atexit._clear()  # noqa: SLF001


def finish() -> None:
    """Python's own exit sequence, run while the interpreter is whole (call from the main thread): the threading
    module's exit callbacks (executors stop their workers there; joining those first would wait forever), the join of
    non-daemon threads, then the atexit handlers, and the streams flushed. A multiprocessing child (a ``halo launch``
    worker) calls this before its function returns, since multiprocessing ends it with ``os._exit``."""
    threading._shutdown()  # noqa: SLF001
    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        stream.flush()


def leave(code: int = 0) -> NoReturn:
    """Call from the main thread, once the rank is done."""
    finish()
    os._exit(code)
