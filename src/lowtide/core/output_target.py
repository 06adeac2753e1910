"""Where a spec may write: its `output.path` must lie inside the spec file's own folder (or
a folder under it). A spec is often someone else's file (an example, a colleague's, a
scheduler's checkout), and `lowtide run` writes as the user who runs it: a spec naming
`/home/me/.bashrc` or `../../.ssh/config` would overwrite it. To write elsewhere, the user
says so on the command line (`--out`), never the spec.

    target = spec_output(spec)          # SpecError naming output.path and the fix
"""

from __future__ import annotations

from pathlib import Path

from lowtide.core.errors import SpecError
from lowtide.core.spec import JobSpec


def spec_output(spec: JobSpec) -> Path | None:
    """The spec's results file, checked to lie inside its folder; None without `output`."""
    if spec.output is None:
        return None
    target = spec.resolve(spec.output.path)
    folder = Path(spec.base_dir).resolve()
    # resolve(): `..` and links already on disk are followed, so neither can lead out.
    if not target.resolve().is_relative_to(folder):
        raise SpecError(f"output.path {spec.output.path}: a spec writes only inside its own folder ({folder}); "
                        "give a path under it, or pass --out to write elsewhere")  # fmt: skip
    return target
