"""Google's field masks as serve reads them (server/gemini_fields.py): the syntax Google
documents, and what a mask keeps of a batch operation."""

from __future__ import annotations

import pytest

from lowtide.server.gemini_fields import apply, parse, selects

OPERATION = {"name": "batches/b", "done": True, "metadata": {"state": "S", "batchStats": {"requestCount": "2", "pendingRequestCount": "0"},
             "output": {"inlinedResponses": {"inlinedResponses": [{"response": {"a": 1}, "metadata": {"key": "k"}}]}}}}  # fmt: skip


@pytest.mark.parametrize(
    ("mask", "kept"),
    [
        ("*", OPERATION),
        ("name", {"name": "batches/b"}),
        ("name,metadata.state", {"name": "batches/b", "metadata": {"state": "S"}}),
        ("metadata/batchStats/requestCount", {"metadata": {"batchStats": {"requestCount": "2"}}}),
        ("metadata(state,batchStats(requestCount))", {"metadata": {"state": "S", "batchStats": {"requestCount": "2"}}}),
        ("metadata(*)", {"metadata": OPERATION["metadata"]}),
        ("metadata.batchStats,metadata", {"metadata": OPERATION["metadata"]}),  # the whole field wins
        ("metadata.output.inlinedResponses.inlinedResponses.metadata",  # through a list: each element
         {"metadata": {"output": {"inlinedResponses": {"inlinedResponses": [{"metadata": {"key": "k"}}]}}}}),
        ("nothing,name", {"name": "batches/b"}),
        (" name , done ", {"name": "batches/b", "done": True}),
    ],
)  # fmt: skip
def test_a_mask_keeps_the_fields_it_names(mask, kept):
    assert apply(parse(mask), OPERATION) == kept


def test_selects_says_whether_anything_under_a_path_is_kept():
    mask = parse("name,metadata(state)")
    assert selects(mask, "metadata") and selects(mask, "metadata", "state")
    assert not selects(mask, "metadata", "output") and not selects(mask, "response")
    assert selects(parse("metadata"), "metadata", "output", "inlinedResponses") and selects(None, "anything")


@pytest.mark.parametrize("mask", ["metadata(state", "name)", "a,,b", "a.", "(a)", ""])
def test_a_malformed_mask_is_refused_with_where(mask):
    with pytest.raises(ValueError, match="character"):
        parse(mask)
