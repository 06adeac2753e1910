"""Gemini: `gemini-batch` (batch mode) and `gemini` in real time on the `google-genai` SDK,
Gemini's wire, its batch operation and its models.
"""
