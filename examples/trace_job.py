"""Run a small job on the `echo` route and send its trace over OTLP/HTTP (docs/traces.md).

    pip install 'lowtide[otel]'
    python examples/trace_job.py                              # prints the spans (no collector needed)
    python examples/trace_job.py http://localhost:4318        # sends them to a collector, Jaeger, …

Everything is written to a new temporary folder; nothing is sent to a provider.
"""

import sys
import tempfile
from pathlib import Path

import lowtide

folder = Path(tempfile.mkdtemp(prefix="lowtide-trace-"))
(folder / "tickets.csv").write_text(
    "ticket_id,body\n"
    "T1,My invoice shows a charge twice\n"
    "T2,The app crashes when I upload a photo\n"
    "T3,I never got the password reset email\n"
)
(folder / "job.yaml").write_text(
    "name: tickets\n"
    "source: {path: tickets.csv, id_column: ticket_id}\n"
    "template: {user: 'Classify this ticket: {{ body }}'}\n"
    "choices: [billing, technical, account]\n"
    "model: gpt-4o-mini\n"
    "route: echo\n"
)

job = lowtide.Job.from_yaml(folder / "job.yaml", store=str(folder / "lowtide.db"))
job.run()

if len(sys.argv) > 1:  # a collector's OTLP/HTTP URL
    sent = lowtide.export_trace("tickets", str(folder / "lowtide.db"), endpoint=sys.argv[1])
else:  # no collector: OpenTelemetry's console exporter prints each span as JSON
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    sent = lowtide.export_trace("tickets", str(folder / "lowtide.db"), exporter=ConsoleSpanExporter())
print(f"trace {sent.trace_id}: {sent.spans} spans")
