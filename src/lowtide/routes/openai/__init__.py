"""OpenAI: `openai-batch` (Files + Batches), `openai` and `openai-compatible` in real time,
`openai-compatible-batch` (the same Batch API at another provider, by profile), and OpenAI's
wire.
"""
