"""FastAPI apps over the engine. `lowtide serve`: a Batch API server (OpenAI and Anthropic
protocols) whose batches run as lowtide jobs on any route."""

from lowtide.server.app import create_app
from lowtide.server.context import ServeConfig

__all__ = ["ServeConfig", "create_app"]
