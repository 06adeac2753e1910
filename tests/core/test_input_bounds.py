"""What a request body holds beyond its text (core/input_bounds.py): the prompt-cache
writes it asks for."""

from __future__ import annotations

from lowtide.core.input_bounds import longer_ttl, scan


def test_cache_writes_are_found_anywhere_at_their_longest_ttl():
    five = {"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}]}
    hour = {"tools": [{"name": "t", "input_schema": {}, "cache_control": {"type": "ephemeral", "ttl": "1h"}}], **five}
    top = {"cache_control": {"type": "ephemeral", "ttl": "5m"}, "messages": []}
    assert [scan(b).cache_ttl for b in (five, hour, top, {"messages": []})] == ["5m", "1h", "5m", None]
    assert (longer_ttl("5m", None), longer_ttl(None, "1h"), longer_ttl("5m", "1h"), longer_ttl(None, None)) == ("5m", "1h", "1h", None)
