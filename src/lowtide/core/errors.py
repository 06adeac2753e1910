"""lowtide's one error tree. Everything a user can act on says what to do.

    LowtideError                 root; `str(err)` is the whole message for the user
    ├── InputError               bad input, refused before anything is stored or sent
    │   ├── SpecError            the job spec (YAML keys, types, unknown fields)
    │   ├── SourceError          the source file (unreadable, format, ids, columns)
    │   └── TemplateError        a template (syntax, undefined variables)
    ├── RouteError               a route failed or is misconfigured
    │   ├── BatchRejected        a provider refused a batch for good (validation, 4xx)
    │   ├── BatchGone            a provider does not know a batch it was polled for (404)
    │   │   └── ResultsGone      ... or no longer has an ended batch's results file (404 on its download)
    │   ├── NotSent              a create provably never reached the provider (refused connection)
    │   └── UnknownRouteError    no route of that name is registered
    ├── StoreError               the store cannot be opened or is from a newer release
    │   └── MissingStoreError    a read-only command found no store where it looked
    └── JobNotFoundError         a job name that is not in the store
"""

from __future__ import annotations


class LowtideError(Exception):
    """Root of every error lowtide raises on purpose."""


class InputError(LowtideError):
    """Bad input: refused before anything is stored or submitted.

    `problems` holds every individual finding so callers (and tests) can count them;
    the message lists them, one per line.
    """

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = problems or [message]
        super().__init__(message)

    @classmethod
    def from_problems(cls, what: str, problems: list[str], limit: int = 50) -> InputError:
        shown = problems[:limit]
        more = len(problems) - len(shown)
        lines = [f"{what}: {len(problems)} problem(s)"] + [f"  - {p}" for p in shown]
        if more:
            lines.append(f"  … and {more} more")
        return cls("\n".join(lines), problems)


class SpecError(InputError):
    """The job spec is invalid."""


class SourceError(InputError):
    """The source data is unreadable or has bad rows."""


class TemplateError(InputError):
    """A template does not compile or does not render for a row."""


class RouteError(LowtideError):
    """A route is misconfigured or failed in a way the engine cannot retry."""


class BatchRejected(RouteError):
    """The provider refused a batch for good; sending it again as it is cannot help."""


class BatchGone(RouteError):
    """The provider answered that it does not know a batch (404 on a poll): it was lost
    there, or the route now points at another provider. Given up after a grace."""


class ResultsGone(BatchGone):
    """The provider answered that it no longer has an ended batch's results (404 on their
    download: deleted there). Given up after the same grace; the message names the file."""


class NotSent(RouteError):
    """A create that provably never reached the provider (the connection was refused, the
    host not found): nothing was created, so nothing needs to be found."""


class UnknownRouteError(RouteError, InputError):
    """No route is registered under that name."""


class RouteUnavailableError(RouteError, InputError):
    """A registered route whose module needs a package that is not installed."""


class StoreError(LowtideError):
    """The store cannot be opened, or was written by a newer lowtide."""


class MissingStoreError(StoreError):
    """A command that only reads found no store (and did not create one)."""


class JobNotFoundError(LowtideError):
    """No job of that name is in the store."""


class JobGone(JobNotFoundError):
    """A job deleted while a worker was working on it (`lowtide delete` of a job with nothing
    in flight, between two of the worker's transactions): the worker leaves it be."""
