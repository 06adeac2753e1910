"""Mistral: `mistral-batch`, Mistral's batch jobs on the `mistralai` SDK, and what its batch takes
of a request.
"""
