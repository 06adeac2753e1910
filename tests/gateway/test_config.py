"""The config file: unknown keys and bad values are refused naming the file, line and key."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from lowtide.cli import app as cli
from lowtide.core.errors import SpecError
from lowtide.server.gateway import build_gateway_config, create_gateway_app, load_gateway_config
from lowtide.server.gateway.config import parse_duration


def test_a_good_file_loads(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text(
        "upstreams:\n  openai: {base_url: 'https://api.openai.com/v1/', api_key_env: OPENAI_API_KEY}\n"
        "batch:\n  openai: {route: openai-batch, models: {gpt-4o-mini: gpt-4o-mini}}\n"
        "collector: {flush_age: 2m}\nrules:\n  - {match: {tenant: a}, action: defer, max_wait: 6h}\n"
    )
    config = load_gateway_config(path)
    assert config.upstreams.openai.base_url == "https://api.openai.com/v1"
    assert config.collector.flush_age == 120 and config.rules[0].max_wait == 6 * 3600
    assert config.base_dir == str(tmp_path)


def test_unknown_keys_name_file_line_and_the_known_keys(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text("upstreams:\n  openai:\n    base_url: http://x/v1\n    api_key: sk-in-the-file\n")
    with pytest.raises(SpecError) as err:
        load_gateway_config(path)
    message = str(err.value)
    assert f"{path} line 4" in message and "upstreams.openai.api_key" in message and "api_key_env" in message


def test_bad_values_are_named(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text("collector:\n  flush_age: soon\ntenants:\n  - {name: a, key_sha256: nothex}\n")
    with pytest.raises(SpecError) as err:
        load_gateway_config(path)
    assert "line 2" in str(err.value) and "collector.flush_age" in str(err.value)
    assert "tenants.0.key_sha256" in str(err.value)


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("10m", 600), ("2h", 7200), ("1d", 86400), (1.5, 1.5)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_an_unknown_batch_route_is_refused_at_start(tmp_path):
    config = build_gateway_config({"batch": {"openai": {"route": "nope"}}, "data_dir": str(tmp_path)})
    with pytest.raises(SpecError, match="batch.openai.*unknown route"):
        create_gateway_app(config, db=str(tmp_path / "x.db"))


def test_the_commands_have_help_with_an_example():
    for command in ("gateway", "gateway-status"):
        result = CliRunner().invoke(cli, [command, "--help"])
        assert result.exit_code == 0 and "Example: lowtide" in result.output


def test_a_missing_upstream_key_is_refused_at_start(tmp_path, monkeypatch):
    monkeypatch.delenv("GW_TEST_MISSING_KEY", raising=False)
    config = build_gateway_config({"upstreams": {"openai": {"base_url": "http://x/v1", "api_key_env": "GW_TEST_MISSING_KEY"}},
                                   "data_dir": str(tmp_path)})
    with pytest.raises(SpecError, match="GW_TEST_MISSING_KEY"):
        create_gateway_app(config, db=str(tmp_path / "x.db"))


def test_a_secret_pasted_where_a_variable_is_named_is_refused_without_repeating_it(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text(
        "upstreams:\n  openai: {base_url: 'http://x/v1', api_key_env: sk-proj-Zq3xY9a1B2c3D4a1B2c3D4}\n"
        "webhooks: {secret_env: whsec_Zq3xY9a1B2c3D4}\n"
    )
    with pytest.raises(SpecError) as err:
        load_gateway_config(path)
    said = str(err.value)
    assert "Zq3xY9" not in said
    assert "line 2: `upstreams.openai.api_key_env`: must name an environment variable" in said
    assert "line 3: `webhooks.secret_env`: must name an environment variable" in said
