"""core/endpoints.py's REQUIRED, the keys each endpoint's body must have, is written out so a
spec check need not import the SDKs; here it is read from the installed SDKs' own types."""

from __future__ import annotations

import pytest

from lowtide.core.endpoints import ENDPOINTS, REQUIRED, request_type, required_of


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_the_written_required_keys_are_the_sdks(endpoint):
    assert REQUIRED[endpoint] == required_of(request_type(endpoint)), (
        f"{endpoint}: the SDK now requires {sorted(required_of(request_type(endpoint)))}; update REQUIRED in core/endpoints.py"
    )
