"""An ended batch whose results file the provider answers 404 for (deleted there by a cleanup
script or in its dashboard, well inside the card's results window): after the grace a batch
the provider does not know gets (an hour), its requests leave it `batch_lost`, retryable,
naming the file, and run again; they were left `dispatched` until the card's 30-day window
passed, an `ingest_error` every poll (now one when "not found" begins, one each download that
breaks off). A download that breaks off is read again next poll, as
long as it takes. openai-batch in the simulation's world (`lowtide serve` in this process,
one ManualClock). A job's output deleted from the user's bucket after it answered is gone the
same way (vertex-batch, GCS emulator; bedrock-batch, moto's S3): it was read as a job that answered nothing, its
requests all `expired` at once with no word of why; a file deleted between the listing and
its read was no error results_gone knew."""

from __future__ import annotations

import boto3
import pytest
import sqlalchemy as sa
from google import genai
from google.genai import types
from google.oauth2.credentials import Credentials

from lowtide.core.locations import location
from lowtide.engine.results_window import results_gone
from lowtide.routes import create_route
from lowtide.routes.vertex import batch as vertex_batch
from lowtide.server.faults import FaultPlan
from lowtide.store.schema import serve_batches, serve_files
from tests.engine.sim_world import dispatch_rows, event_rows, load, request_rows, rounds, world
from tests.sim import invariants
from tests.sim.world import KEY


def _ended(w) -> str:
    """Job a's three requests in one openai-batch batch, which the provider runs to its end;
    the id of its output file."""
    load(w, "openai-batch", rows=3, chunk=3)
    w.tick()
    w.serve_step()
    with w.providers["main"].store.read() as conn:
        [output] = conn.scalars(sa.select(serve_batches.c.output_file_id)).all()
    assert output
    return output


def test_a_results_file_the_provider_deleted_gives_its_requests_up_after_the_lost_grace(tmp_path):
    with world(tmp_path) as w:
        output = _ended(w)
        with w.providers["main"].store.begin() as conn:
            conn.execute(sa.delete(serve_files).where(serve_files.c.id == output))  # deleted at the provider
        rounds(w, 5, 600)  # 50 minutes of polls, each download answered 404: inside the grace
        assert [d.state for d in dispatch_rows(w)] == ["submitted"]
        assert [r.state for r in request_rows(w)] == ["dispatched"] * 3

        rounds(w, 4, 600)  # past the hour: given up, its requests sent again in a new batch
        first = dispatch_rows(w)[0]
        assert first.state == "failed" and output in first.error and "not found" in first.error, first.error
        [said] = event_rows(w, "batch_lost")
        assert output in said
        rounds(w, 4, 600)
        rows = request_rows(w)
        assert [r.state for r in rows] == ["succeeded"] * 3 and {r.attempts for r in rows} == {2}
        assert [d.state for d in dispatch_rows(w)] == ["failed", "ended"] and invariants.batches_created(w) == 2


def test_results_not_found_are_said_once_a_streak_and_a_download_that_breaks_off_each_time(tmp_path):
    """An `ingest_error` when the provider first answers that the results are not found, not one
    each poll of the hour's grace (a dozen identical events a batch, and more the shorter its
    poll interval); `batch_lost` says it again when the batch is given up. A download that
    breaks off is said each time, and ends the streak: "not found" after it is said again,
    and its hour counts from then."""
    with world(tmp_path) as w:
        output = _ended(w)
        with w.providers["main"].store.begin() as conn:
            conn.execute(sa.delete(serve_files).where(serve_files.c.id == output))
        rounds(w, 5, 600)  # polls, each download answered 404
        [said] = event_rows(w, "ingest_error")
        assert output in said and "not found" in said and "given up if still not found in 1 h" in said, said

        w.set_faults(FaultPlan.model_validate({"http": [{"match": "GET /v1/files/*/content", "status": 500, "retry_after": 0}]}))
        rounds(w, 2, 600)
        broke = event_rows(w, "ingest_error")[1:]
        assert len(broke) == 2 and all("500" in e and "given up" not in e for e in broke), broke
        assert [d.lost_since for d in dispatch_rows(w)] == [None]

        w.clear_faults()
        rounds(w, 5, 600)  # not found again: a new streak, said once, its hour from its start
        assert len(event_rows(w, "ingest_error")) == 4 and event_rows(w, "ingest_error")[3] == said
        assert [d.state for d in dispatch_rows(w)] == ["submitted"] and event_rows(w, "batch_lost") == []
        rounds(w, 3, 600)
        assert [d.state for d in dispatch_rows(w)][0] == "failed" and len(event_rows(w, "batch_lost")) == 1
        assert len(event_rows(w, "ingest_error")) == 4


def test_a_results_download_that_breaks_off_is_read_again_however_long_it_takes(tmp_path):
    with world(tmp_path) as w:
        _ended(w)
        w.set_faults(FaultPlan.model_validate({"http": [{"match": "GET /v1/files/*/content", "status": 500, "retry_after": 0}]}))
        rounds(w, 4, 1800)  # two hours of downloads that fail, none saying the file is gone
        assert [d.state for d in dispatch_rows(w)] == ["submitted"]
        assert [r.state for r in request_rows(w)] == ["dispatched"] * 3 and event_rows(w, "batch_lost") == []
        w.set_faults(FaultPlan())
        rounds(w, 2, 600)
        assert [r.state for r in request_rows(w)] == ["succeeded"] * 3 and invariants.batches_created(w) == 1


def _read_once(w, route: str) -> None:
    """What the engine's poll would do first: read the ended job, by the provider's own SDK.
    Serve writes a job's output in the bucket on the first read after it ended."""
    [sent] = dispatch_rows(w)
    url = w.providers["main"].url
    if route == "vertex-batch":
        client = genai.Client(vertexai=True, project="proj", location="us-central1", credentials=Credentials(token=KEY),
                              http_options=types.HttpOptions(base_url=url, api_version="v1"))  # fmt: skip
        assert client.batches.get(name=sent.provider_id).output_info.gcs_output_directory
    else:
        job = boto3.client("bedrock", endpoint_url=url, region_name="us-east-1").get_model_invocation_job(jobIdentifier=sent.provider_id)
        assert job["status"] == "Completed"


@pytest.mark.parametrize(("route", "rows", "output"), [("vertex-batch", 3, "predictions.jsonl"), ("bedrock-batch", 100, ".jsonl.out")])
def test_output_deleted_from_the_bucket_gives_its_requests_up_after_the_lost_grace(tmp_path, route, rows, output):
    """The job answered, then its output was deleted in the user's bucket (a lifecycle rule, a
    cleanup): not found, as an OpenAI file answering 404 is, so after the grace its requests go
    on. Read as a job that answered nothing, they were all `expired` at once, no word of why."""
    with world(tmp_path, route) as w:
        load(w, route, rows=rows, chunk=rows)
        w.tick()
        w.serve_step()  # the provider runs the job to its end
        _read_once(w, route)
        loc = location(f"{w.objects.url}/lowtide")
        written = [p for p in loc.fs.find(loc.path) if p.endswith(output)]
        assert len(written) == 1
        loc.fs.rm(written)  # deleted in the bucket
        rounds(w, 5, 600)  # 50 minutes of polls, each finding no output: inside the grace
        assert [d.state for d in dispatch_rows(w)] == ["submitted"]
        assert {r.state for r in request_rows(w)} == {"dispatched"}
        said = event_rows(w, "ingest_error")[0]
        assert "not found" in said and "deleted there" in said and written[0].rsplit("/", 2)[0] in said

        rounds(w, 4, 600)  # past the hour: given up, its requests sent again in a new batch
        first = dispatch_rows(w)[0]
        assert first.state == "failed" and "not found" in first.error and first.provider_id in first.error, first.error
        [lost] = event_rows(w, "batch_lost")
        assert first.provider_id in lost
        rounds(w, 4, 600)
        got = request_rows(w)
        assert {r.state for r in got} == {"succeeded"} and {r.attempts for r in got} == {2}
        assert [d.state for d in dispatch_rows(w)] == ["failed", "ended"]


@pytest.mark.parametrize(("route", "rows"), [("vertex-batch", 3), ("bedrock-batch", 100)])
def test_an_output_file_deleted_after_it_was_listed_is_gone_too(tmp_path, monkeypatch, route, rows):
    """The listing names a second file, deleted before it is read (a listing made just before
    the cleanup): not found, said as such, after the first file's answers; it was a missing
    spool file (vertex: gcsfs removes a download it could not finish) or s3fs's bare
    FileNotFoundError, neither of them gone: read again every poll."""
    with world(tmp_path, route) as w:
        load(w, route, rows=rows, chunk=rows)
        w.tick()
        w.serve_step()
        _read_once(w, route)
        [sent] = dispatch_rows(w)
        made = create_route(route, w.route_options(route, rows))
        if route == "vertex-batch":
            listed = vertex_batch._prediction_files
            monkeypatch.setattr(vertex_batch, "_prediction_files", lambda folder: [*listed(folder), f"{listed(folder)[0]}-2.jsonl"])
        else:
            listed = made.store.fs.find
            monkeypatch.setattr(made.store.fs, "find", lambda folder: [*listed(folder), f"{folder}/zz.jsonl.out"])

        async def read() -> tuple[int, BaseException | None]:
            n = 0
            try:
                async for _ in made.results(sent.provider_id):
                    n += 1
            except Exception as err:
                return n, err
            finally:
                await made.aclose()
            return n, None

        n, err = w.run(read())
        assert n == rows and err is not None and results_gone(err), err
        assert "not found" in str(err) and sent.provider_id in str(err) and ("-2.jsonl" in str(err) or "zz.jsonl.out" in str(err))
