"""lowtide: LLM work that can wait, as cheap and reliable offline jobs."""

__version__ = "0.1.0"

from lowtide.api import Job  # noqa: E402
from lowtide.core.errors import LowtideError  # noqa: E402
from lowtide.core.spec import JobSpec, load_spec  # noqa: E402

__all__ = ["Job", "JobSpec", "LowtideError", "__version__", "load_spec"]
