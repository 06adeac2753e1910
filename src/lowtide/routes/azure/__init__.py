"""Azure OpenAI: `azure-batch`, OpenAI's Files + Batches API at an Azure resource."""
