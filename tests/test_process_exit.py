"""leave(): a finished rank skips native teardown but not what Python's own exit would do first."""

import subprocess
import sys
import textwrap


def test_leave_joins_threads_runs_exit_handlers_and_flushes(tmp_path):
    script = textwrap.dedent(
        f"""
        import atexit, sys, threading, time
        from pathlib import Path
        from halo_core.parallel.process_exit import leave

        out = Path({str(tmp_path)!r})
        atexit.register(lambda: (out / "atexit").write_text("ran"))
        threading.Thread(target=lambda: (time.sleep(0.2), (out / "thread").write_text("finished"))).start()
        sys.stdout.write("buffered, not yet flushed")
        leave(3)
        (out / "after").write_text("leave returned")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered, not yet flushed"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "finished"
    assert not (tmp_path / "after").exists()
