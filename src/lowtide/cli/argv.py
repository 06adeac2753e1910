"""Global options in any position: `lowtide status --db x.db` means `lowtide --db x.db status`.

Click only reads a group's options before the subcommand, so `main` moves them there first.
A command with its own `--db` (serve, gateway) keeps it: its option, not the global one.
"""

from __future__ import annotations

from collections.abc import Callable

VALUE_OPTIONS = frozenset({"--db"})
FLAG_OPTIONS = frozenset({"--debug"})


def hoist_global_options(args: list[str], own: Callable[[str], set[str]]) -> list[str]:
    """`args` with every global option moved before the subcommand. `own(name)` gives the
    global option names subcommand `name` defines itself (left where they are); it is asked
    only about the subcommand named, and only where a global option follows it."""
    front: list[str] = []
    moved: list[str] = []
    rest: list[str] = []
    command: str | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg.split("=", 1)[0]
        if arg == "--":  # everything after it is an argument, never an option
            rest.extend(args[i:])
            break
        is_global = name in VALUE_OPTIONS or arg in FLAG_OPTIONS
        if is_global and (command is None or name not in own(command)):
            takes_value = name in VALUE_OPTIONS and "=" not in arg and i + 1 < len(args)
            (front if command is None else moved).extend(args[i : i + 1 + takes_value])
            i += 1 + takes_value
            continue
        if command is None:
            if arg.startswith("-"):
                front.append(arg)  # --version, --help
            else:
                command = arg
                rest.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + moved + rest
