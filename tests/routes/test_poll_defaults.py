"""A loopback base_url (lowtide serve, a test server) polls from 1 s; providers keep theirs."""

from __future__ import annotations

import pytest

from lowtide.routes.provider import LOOPBACK_POLL, poll_interval

PROVIDER = (30.0, 600.0)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1", "http://localhost:8000", "http://[::1]:8000/v1", "http://127.0.0.2/v1"])
def test_a_loopback_base_url_polls_soon(url):
    assert poll_interval({"base_url": url}, PROVIDER) == LOOPBACK_POLL == (1.0, 10.0)


@pytest.mark.parametrize("options", [{}, {"base_url": "https://api.openai.com/v1"}, {"base_url": "http://10.0.0.5:8000/v1"}])
def test_providers_and_remote_servers_keep_their_defaults(options):
    assert poll_interval(options, PROVIDER) == PROVIDER


def test_the_specs_own_poll_interval_wins_even_on_loopback():
    assert poll_interval({"base_url": "http://127.0.0.1:8000/v1", "poll_interval": [5, 60]}, PROVIDER) == (5.0, 60.0)
