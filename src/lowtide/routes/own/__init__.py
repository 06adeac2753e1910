"""lowtide's own engines: `echo` and `echo-batch` (instant, deterministic), `local` (an embedded
model on llama.cpp), `local_embed` (embedded embeddings), and what they share: how a body is
read as plain turns, what it asks of the answer's structure, instances of a JSON Schema.
"""
