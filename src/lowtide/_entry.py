"""The `lowtide` command's entry point. Importing the commands is most of start-up, so a
Ctrl-C then ends with one line, not a traceback; and SIGTERM (a service manager, `kill`)
stops a command as Ctrl-C does: it says where the job stands and exits 130."""

from __future__ import annotations

import signal
import sys

EXIT_INTERRUPTED = 130  # cli/common.py's, which this module must not import yet


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    try:
        from lowtide.cli import main as run
    except KeyboardInterrupt:
        print("lowtide: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    run()


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # every command already ends a Ctrl-C cleanly
