"""lowtide: LLM work that can wait, as cheap and reliable offline jobs."""

__version__ = "0.1.0"
