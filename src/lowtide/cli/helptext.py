"""Help text that reads well at any width: click rewraps each paragraph of a docstring, so
its hard line breaks never split a sentence; `Example:` lines stay one to a line, unwrapped;
options show a plain metavar (`--db DB`), flags none."""

from __future__ import annotations

from typing import Any

# The command list's one line per command. Click would cut each docstring's first sentence
# at the width left (`Submit a job and drive it to completion, then write its...`); these fit
# beside the longest command name in 80 columns.
SUMMARIES = {
    "run": "Submit a job and drive it to the end.",
    "submit": "Check a job and store its requests; send nothing.",
    "estimate": "A job's tokens, cost and wait on each tier.",
    "prices": "The prices that apply to a model, and their sources.",
    "routes": "Each route's limits, recovery, retention and discount.",
    "status": "How far jobs are: requests by state, live batches.",
    "results": "Write a job's results joined to its source rows.",
    "cancel": "Cancel a job's unsent requests and live batches.",
    "retry": "Queue failed (or cancelled) requests again.",
    "report": "Tokens, cost, real-time equivalent and savings.",
    "tick": "One non-blocking pass over every job.",
    "worker": "Tick every job in a loop.",
    "serve": "A local OpenAI/Anthropic/Gemini batch API.",
    "compare": "Compare an eval's variants, with statistics and cost.",
    "gateway": "Real time for urgent calls, batches for the rest.",
    "gateway-status": "The gateway's deferred requests by state.",
    "dashboard": "The dashboard alone over a store, read-only; no batch API.",
    "render": "The exact request bodies a job would send; sends nothing.",
    "try": "One prompt in real time, stored as a one-row job.",
    "delete": "Delete a job and everything stored for it.",
    "prune": "Drop old finished jobs' payloads and answers.",
    "trace": "Send a job's trace (batches, attempts) over OTLP.",
}


def tidy(command: Any) -> None:
    """Tidy `command` (Typer's click command) and its subcommands' help in place."""
    if command.help:
        command.help = _examples_apart(command.help)
    if command.name in SUMMARIES and not command.short_help:
        command.short_help = SUMMARIES[command.name]
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
