"""Help text that reads well at any width: click rewraps each paragraph of a docstring, so
its hard line breaks never split a sentence; `Example:` lines stay one to a line, unwrapped;
options show a plain metavar (`--db DB`), flags none."""

from __future__ import annotations

from typing import Any


def tidy(command: Any) -> None:
    """Tidy `command` (Typer's click command) and its subcommands' help in place."""
    if command.help:
        command.help = _examples_apart(command.help)
    for param in command.params:
        if getattr(param, "is_flag", False):
            continue
        if param.name and param.metavar is None:
            param.metavar = param.name.upper()
    for sub in getattr(command, "commands", {}).values():
        tidy(sub)


def _examples_apart(text: str) -> str:
    """Each run of `Example:` lines becomes its own paragraph, kept as written (`\\b`)."""
    out: list[str] = []
    in_examples = False
    for line in text.splitlines():
        example = line.strip().startswith("Example:")
        if example and not in_examples:
            if out and out[-1].strip():
                out.append("")
            out.append("\b")
        elif not example and in_examples and line.strip():
            out.append("")
        in_examples = example or (in_examples and not line.strip() and False)
        out.append(line)
    return "\n".join(out)
