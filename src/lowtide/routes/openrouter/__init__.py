"""OpenRouter: `openrouter-batch`, OpenRouter's inline Batch API, and what it refuses in a
request.
"""
