"""`lowtide serve` as a command: help with an example, options checked before starting."""

from __future__ import annotations

from typer.testing import CliRunner

from lowtide.cli import app


def test_serve_has_help_with_an_example():
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "Example: lowtide serve" in result.output
    for option in ("--backend", "--port", "--data-dir", "--api-key", "--time-scale", "--complete-after", "--faults"):
        assert option in result.output


def test_bad_options_are_refused_before_starting(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["serve", "--option", "novalue", "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2 and "KEY=VALUE" in result.output
    result = runner.invoke(app, ["--db", str(tmp_path / "x.db"), "serve", "--backend", "nope", "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2 and "known routes" in result.output
    (tmp_path / "plan.yaml").write_text("http: [{match: '*'}]\n")
    result = runner.invoke(app, ["--db", str(tmp_path / "x.db"), "serve", "--faults", str(tmp_path / "plan.yaml"), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2 and "plan.yaml" in result.output and "status" in result.output


def test_body_limits_are_options_and_bad_ones_are_refused(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    for option in ("--max-request-size", "--max-batch-size", "--max-file-size", "--body-timeout", "--max-json-depth"):
        assert option in result.output
    result = runner.invoke(app, ["serve", "--max-file-size", "lots", "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2 and "--max-file-size 'lots'" in result.output and "32MB" in result.output
    result = runner.invoke(app, ["serve", "--max-json-depth", "100000", "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2


def test_a_key_file_that_cannot_be_read_or_holds_no_key_is_refused_by_name(tmp_path):
    runner = CliRunner()
    missing = tmp_path / "nokeys"
    result = runner.invoke(app, ["serve", "--api-key-file", str(missing), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2 and f"--api-key-file {missing}: cannot read it" in result.output
    empty = tmp_path / "empty"
    empty.write_text("# none yet\n\n")
    result = runner.invoke(app, ["serve", "--api-key-file", str(empty), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2 and "holds no key" in result.output  # never served open by mistake


def test_other_site_options_are_checked_before_starting(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    for option in ("--allow-host", "--allow-origin", "--api-key-file", "--header-timeout"):
        assert option in result.output
    result = runner.invoke(app, ["serve", "--allow-origin", "evil.example", "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2 and "--allow-origin 'evil.example'" in result.output and "https://app.example.com" in result.output
    result = runner.invoke(app, ["serve", "--allow-host", "http://host/x", "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2 and "--allow-host 'http://host/x'" in result.output
    result = runner.invoke(app, ["gateway", "--help"], env={"COLUMNS": "200"})
    for option in ("--allow-host", "--allow-origin", "--header-timeout"):
        assert option in result.output
