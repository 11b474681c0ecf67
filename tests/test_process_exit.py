"""leave(): a finished rank skips native teardown but not what Python's own exit would do first."""

import subprocess
import sys
import textwrap


def test_leave_joins_threads_runs_exit_handlers_and_flushes(tmp_path):
    """An idle executor (inductor's compile workers, a loader's pool) must not hang the exit: seen with
    compiled EP layers at world 4, when leave() joined threads before stopping executors."""
    script = textwrap.dedent(
        f"""
        import atexit, sys, threading, time
        from concurrent.futures import ThreadPoolExecutor
        from pathlib import Path
        from halo_core.parallel.process_exit import leave

        idle = ThreadPoolExecutor(2)  # its workers wait for work until the threading module's exit callbacks stop them
        idle.submit(time.sleep, 0).result()
        out = Path({str(tmp_path)!r})
        atexit.register(lambda: (out / "atexit").write_text("ran"))
        threading.Thread(target=lambda: (time.sleep(0.2), (out / "thread").write_text("finished"))).start()
        sys.stdout.write("buffered, not yet flushed")
        leave(3)
        (out / "after").write_text("leave returned")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)  # a hang is a failure
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered, not yet flushed"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "finished"
    assert not (tmp_path / "after").exists()


def test_a_forked_worker_runs_its_own_exit_handlers_not_its_parents(tmp_path):
    """``halo launch`` forks its workers: the launcher's ``TemporaryDirectory`` (a ``weakref.finalize`` run at exit)
    and its atexit handlers must stay the launcher's, while a tracker the worker starts still finishes at its exit."""
    script = textwrap.dedent(
        f"""
        import atexit, multiprocessing, os, tempfile
        from pathlib import Path
        from halo_core.parallel.process_exit import finish, forget_parent_exit_handlers

        out = Path({str(tmp_path)!r})
        folder = tempfile.TemporaryDirectory(dir=out)
        atexit.register(lambda: (out / f"parent-handler-{{os.getpid()}}").write_text("ran"))

        def worker():
            forget_parent_exit_handlers()
            atexit.register(lambda: (out / "worker-handler").write_text("ran"))
            finish()

        child = multiprocessing.get_context("fork").Process(target=worker)
        child.start()
        child.join()
        assert child.exitcode == 0
        assert Path(folder.name).is_dir(), "the worker deleted the launcher's folder"
        print(os.getpid())
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "worker-handler").read_text() == "ran"
    assert [p.name for p in tmp_path.glob("parent-handler-*")] == [f"parent-handler-{done.stdout.strip()}"]
