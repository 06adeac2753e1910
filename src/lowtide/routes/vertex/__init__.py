"""Vertex AI: `vertex-batch`, Gemini models on Vertex AI batch prediction through the
`google-genai` SDK (`vertexai=True`), its inputs and outputs in Cloud Storage.
"""
