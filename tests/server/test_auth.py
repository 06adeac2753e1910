"""API keys: none configured accepts any key; configured keys are checked, and a wrong or
missing key gets each provider's 401."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.server.conftest import message_request, upload


def test_without_keys_any_key_is_accepted(server):
    assert upload(server.openai(key="anything"), [{"x": 1}]).id.startswith("file-")
    assert server.anthropic(key="else").messages.batches.list().data == []


def test_with_keys_a_wrong_key_gets_openais_401(serve):
    with serve(api_keys=("k1", "k2")) as s:
        assert s.openai(key="k2").batches.list().data == []
        with pytest.raises(openai.AuthenticationError) as err:
            s.openai(key="wrong").batches.list()
        assert err.value.status_code == 401
        assert err.value.response.json() == {"error": {"message": "Incorrect API key provided.", "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
        assert "wrong" not in err.value.response.text
        with pytest.raises(openai.AuthenticationError):
            upload(s.openai(key="wrong"), [{"x": 1}])


def test_with_keys_a_wrong_key_gets_anthropics_401(serve):
    with serve(api_keys=("k1",)) as s:
        assert s.anthropic(key="k1").messages.batches.create(requests=[message_request("a")]).id
        with pytest.raises(anthropic.AuthenticationError) as err:
            s.anthropic(key="wrong").messages.batches.list()
        assert err.value.response.json() == {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}


def test_a_missing_key_is_refused(serve):
    with serve(api_keys=("k1",)) as s:
        http = s.openai()._client
        answer = http.get(f"{s.url}/v1/batches")
        assert answer.status_code == 401 and answer.json()["error"]["code"] is None
        assert "Authorization: Bearer" in answer.json()["error"]["message"]
        answer = http.get(f"{s.url}/v1/messages/batches")
        assert answer.status_code == 401 and answer.json()["error"]["type"] == "authentication_error"
