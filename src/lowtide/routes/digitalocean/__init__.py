"""DigitalOcean: `digitalocean-batch`, DigitalOcean's batch inference (Gradient AI serverless
inference) on the `pydo` SDK.
"""
