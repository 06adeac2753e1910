"""Where results go: a spec's `output` (or `--out`) as one `OutputTarget`, a file or folder
(local, or an object-store URL) or a SQL table.

A local `output.path` must lie inside the spec file's own folder (or a folder under it). A
spec is often someone else's file (an example, a colleague's, a scheduler's checkout), and
`lowtide run` writes as the user who runs it: a spec naming `/home/me/.bashrc` or
`../../.ssh/config` would overwrite it. To write elsewhere on this machine, the user says so
on the command line (`--out`), never the spec. An object-store URL or a SQL table is a place
the store's own credentials guard, and a spec may name it.

    target = output_target(spec, out)   # SpecError naming output.path and the fix
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lowtide.core.errors import SpecError
from lowtide.core.locations import scheme_of
from lowtide.core.spec import JobSpec


@dataclass(frozen=True, slots=True)
class OutputTarget:
    where: str  # how the user named it, for messages: "output.path", "output.url" or "--out"
    path: str | None = None  # a file, or with partition_by a folder: a local path (absolute) or a URL
    fmt: str | None = None  # `output.format`; None: by the extension
    partition_by: tuple[str, ...] = ()
    url: str | None = None  # a SQL output: an SQLAlchemy URL (no password) ...
    table: str | None = None  # ... and its table

    @property
    def local(self) -> bool:
        return self.path is not None and scheme_of(self.path) is None

    @property
    def shown(self) -> str:
        """The target in words, for messages and reports."""
        if self.table is not None:
            from lowtide.core.sql_urls import shown_url

            return f"{shown_url(self.url)} table {self.table}"
        return str(self.path)


def spec_output(spec: JobSpec) -> Path | str | None:
    """The spec's results file or folder: a local path checked to lie inside the spec's
    folder, or an object-store URL as written; None without `output.path`."""
    if spec.output is None or spec.output.path is None:
        return None
    if scheme_of(spec.output.path) is not None:
        return spec.output.path
    target = spec.resolve(spec.output.path.removeprefix("file://"))
    folder = Path(spec.base_dir).resolve()
    # resolve(): `..` and links already on disk are followed, so neither can lead out.
    if not target.resolve().is_relative_to(folder):
        raise SpecError(f"output.path {spec.output.path}: a spec writes only inside its own folder ({folder}); "
                        "give a path under it, or pass --out to write elsewhere")  # fmt: skip
    return target


def output_target(spec: JobSpec, out: str | Path | None = None) -> OutputTarget | None:
    """Where this run's results go: `out` (the user's own choice: any path or URL, a file),
    else the spec's `output` (checked: spec_output); None when neither says."""
    if out is not None:
        text = str(out)
        return OutputTarget("--out", text if scheme_of(text) is not None else str(Path(text).expanduser()))
    o = spec.output
    if o is None:
        return None
    if o.url is not None:
        return OutputTarget("output.url", url=o.url, table=o.table)
    return OutputTarget("output.path", str(spec_output(spec)), o.format, tuple(o.partition_by))
