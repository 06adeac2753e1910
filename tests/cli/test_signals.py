"""How the real `lowtide` command ends when told to stop: SIGTERM stops it as Ctrl-C does
(a line that says so, exit 130), and a Ctrl-C while it is still importing its commands ends
with one line, not a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from tests.cli.test_cli import LOWTIDE


def test_sigterm_stops_a_worker_with_its_message_and_exit_130(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")} | {"LOWTIDE_DB": str(tmp_path / "s.db")}
    proc = subprocess.Popen([str(LOWTIDE), "worker"], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    # The worker is in its loop once it has made its store (an idle worker prints nothing).
    deadline = time.monotonic() + 120
    while not (tmp_path / "s.db").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    said, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, said
    assert "worker stopped" in said and "Traceback" not in said


def test_ctrl_c_while_the_commands_load_ends_with_one_line(tmp_path):
    # Deterministic: the child interrupts itself as it starts importing the command modules.
    child = textwrap.dedent("""
        import os, signal, sys
        class Interrupt:
            def find_spec(self, name, path=None, target=None):
                if name == "lowtide.cli.jobs":
                    os.kill(os.getpid(), signal.SIGINT)
                return None
        sys.meta_path.insert(0, Interrupt())
        from lowtide._entry import main
        sys.argv = ["lowtide", "status"]
        main()
    """)
    done = subprocess.run([sys.executable, "-c", child], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "lowtide: interrupted", done.stderr
