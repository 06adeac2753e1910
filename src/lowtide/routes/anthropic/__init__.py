"""Anthropic: `anthropic-batch` (Message Batches), `anthropic` in real time, Anthropic's wire, and
the one mapping from a chat completions body.
"""
