"""The real `lowtide serve` keeps its memory flat while a big message batch streams in:
refused at its limit while still arriving, or taken in request by request (rss_probe.py;
the figures for 400 MB and 200 MB bodies are in docs/serve.md)."""

from __future__ import annotations

import pytest

from tests.server.rss_probe import LOWTIDE, measure

MB = 1024 * 1024
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not LOWTIDE.exists(), reason=f"no lowtide script at {LOWTIDE}")]


def _growth(figures: dict) -> float:
    return (figures["rss_peak_kib"] - figures["rss_before_kib"]) / 1024


def test_a_chunked_batch_over_the_limit_is_refused_without_taking_it_into_memory():
    figures = measure(96 * MB, "--max-batch-size", "16MB", prompt_kb=8)
    assert "413" in figures["status"]
    assert _growth(figures) < 24, figures  # before: the whole body was read first (> 96 MB)


def test_a_valid_batch_is_taken_in_without_holding_it_whole():
    figures = measure(64 * MB, "--max-batch-size", "80MB")
    assert "200" in figures["status"]
    assert _growth(figures) < 32, figures  # before: the parsed body, several times its size
