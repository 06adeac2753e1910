"""genai-prices for the hosts of open models that lowtide's batch routes reach.

Groq, Together, Novita and Doubleword each run open models (Llama, Qwen, gpt-oss, …)
behind an OpenAI-compatible Batch API (`openai-compatible-batch`, one profile each). Their
price lists are in genai-prices under the same provider ids, read by core/genai_source.py as
OpenAI's, Anthropic's and Google's are (the same `GenaiEntry`), so `pricing.Catalog` treats a
host like any other price list.

A model's id is the host's own (`openai/gpt-oss-120b` at Groq, Together and Novita alike;
`meta-llama/Llama-3.3-70B-Instruct-Turbo` at Together): a job's `model` is priced at
each candidate host by that one id, and a host that does not list it has no price.
"""

from __future__ import annotations

# The price lists genai-prices keeps for the hosts and clouds lowtide's batch routes reach beyond
# the three providers: open-model hosts, and Mistral, OpenRouter, Azure and AWS Bedrock.
HOSTS = ("groq", "together", "novita", "doubleword", "mistral", "openrouter", "azure", "aws")
