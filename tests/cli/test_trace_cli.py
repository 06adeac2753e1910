"""`lowtide trace`, `run --trace-to` and `worker --trace-to`: the real command as a
subprocess, sending to a real OTLP/HTTP receiver on loopback; and the message of a missing
`otel` extra, with OpenTelemetry hidden from the process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_cli import LOWTIDE, Cli, write_job

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otel extra is not installed")

from tests.otlp_receiver import OtlpReceiver, attrs  # noqa: E402

pytestmark = pytest.mark.skipif(not LOWTIDE.exists(), reason=f"no lowtide script at {LOWTIDE}")

# The command with OpenTelemetry made unimportable, as on an install without the extra.
WITHOUT_OTEL = "import sys; sys.modules['opentelemetry'] = None; from lowtide.cli import main; main()"
EXTRA_MESSAGE = ("lowtide: exporting traces needs the otel extra, opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http "
                 "(opentelemetry.exporter cannot be imported); install it with `pip install 'lowtide[otel]'`")


@pytest.fixture
def cli(tmp_path) -> Cli:
    return Cli(tmp_path, str(tmp_path / "lowtide.db"))


@pytest.fixture
def receiver():
    with OtlpReceiver() as rx:
        yield rx


def test_run_sends_the_trace_when_the_job_ends_and_trace_sends_the_same_again(cli, tmp_path, receiver):
    write_job(tmp_path, rows=6)
    code, said = cli("run", "job.yaml", "--trace-to", receiver.url)
    assert code == 0, said
    spans = receiver.received.spans
    assert len(spans) == 1 + 1 + 6  # the job, its direct dispatch on echo, six attempts
    trace_id = spans[0].trace_id.hex()
    assert f"trace {trace_id}: 8 spans of job tickets sent to {receiver.url}/v1/traces" in said
    assert sorted({attrs(s)["lowtide.custom_id"] for s in spans if "lowtide.custom_id" in attrs(s)}) == [f"T{1000 + i}" for i in range(6)]

    ids = {(s.trace_id, s.span_id) for s in spans}
    spans.clear()
    code, said = cli("trace", "tickets", "--endpoint", receiver.url, "-H", "Authorization=Basic abc", "--json")
    assert code == 0, said
    assert json.loads(said) == {"job": "tickets", "trace_id": trace_id, "spans": 8, "endpoint": f"{receiver.url}/v1/traces"}
    assert {(s.trace_id, s.span_id) for s in spans} == ids
    assert receiver.received.headers[-1]["authorization"] == "Basic abc"


def test_worker_sends_each_job_it_finishes(cli, tmp_path, receiver):
    write_job(tmp_path, rows=3)
    assert cli("submit", "job.yaml")[0] == 0
    code, said = cli("worker", "--until-idle", "--trace-to", receiver.url)
    assert code == 0, said
    assert "3 of" not in said and "spans of job tickets sent" in said
    assert sorted(s.name for s in receiver.received.spans) == ["chat test-model"] * 3 + ["direct echo", "job tickets"]


def test_a_collector_that_is_not_there_leaves_the_job_done_and_says_how_to_send_again(cli, tmp_path):
    write_job(tmp_path, rows=2)
    with OtlpReceiver() as gone:  # a port that was just listening, now closed
        url = gone.url
    cli.env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "1"  # seconds the exporter keeps trying (default 10)
    code, said = cli("run", "job.yaml", "--trace-to", url)
    assert code == 0, said  # the job ran and its results are written; the trace can wait
    assert f"lowtide: trace of job tickets not sent: {url}/v1/traces did not take the trace of job tickets" in said
    code, said = cli("trace", "tickets", "--endpoint", url, "--timeout", "0.5")
    assert code == 3 and "export it again (`lowtide trace JOB`)" in said


def test_bad_options_are_refused_before_anything_runs(cli, tmp_path):
    write_job(tmp_path, rows=2)
    code, said = cli("run", "job.yaml", "--trace-to", "localhost:4317")
    assert code == 2 and "--endpoint 'localhost:4317': give the collector's OTLP/HTTP URL" in said
    assert not (tmp_path / "lowtide.db").exists()
    assert cli("run", "job.yaml")[0] == 0
    code, said = cli("trace", "tickets", "-H", "no-equals-sign")
    assert code == 2 and "--header 'no-equals-sign': give NAME=VALUE" in said
    code, said = cli("trace", "nope", "--endpoint", "http://127.0.0.1:9")
    assert code == 2 and 'no job named "nope"' in said


def test_without_the_extra_lowtide_names_it_and_everything_else_runs(cli, tmp_path):
    write_job(tmp_path, rows=2)

    def without_otel(*args: str) -> tuple[int, str]:
        proc = subprocess.run([sys.executable, "-c", WITHOUT_OTEL, *args], cwd=tmp_path, env=cli.env, capture_output=True, text=True, timeout=120)
        return proc.returncode, proc.stdout + proc.stderr

    code, said = without_otel("run", "job.yaml")  # the core install: no trace asked for, none needed
    assert code == 0, said
    code, said = without_otel("trace", "tickets", "--endpoint", "http://127.0.0.1:9")
    assert (code, said.strip()) == (3, EXTRA_MESSAGE)
    code, said = without_otel("run", "job.yaml", "--trace-to", "http://127.0.0.1:9")
    assert (code, said.strip()) == (3, EXTRA_MESSAGE)  # refused before the run, not after it

    probe = "import sys; sys.modules['opentelemetry'] = None; import lowtide; lowtide.export_trace('tickets', 'lowtide.db')"
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=cli.env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.strip().endswith("lowtide.core.errors.LowtideError: " + EXTRA_MESSAGE.removeprefix("lowtide: "))


def test_the_command_line_loads_no_opentelemetry_until_a_trace_is_sent():
    probe = "import sys, lowtide.cli, lowtide.api; print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_the_docs_example_runs_as_written(tmp_path, receiver):
    example = Path(__file__).resolve().parents[2] / "examples" / "trace_job.py"
    proc = subprocess.run([sys.executable, str(example)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert '"name": "job tickets"' in proc.stdout and proc.stdout.count('"name": "chat gpt-4o-mini"') == 3
    assert proc.stdout.rstrip().splitlines()[-1].endswith(": 5 spans")
    proc = subprocess.run([sys.executable, str(example), receiver.url], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(receiver.received.spans) == 5
