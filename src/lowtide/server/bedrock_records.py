"""The S3 side of serve's Bedrock batch jobs (bedrock_api.py): reading a job's input records
and writing its output records, through s3fs (core/locations.py), pointed at a local S3 (moto,
MinIO) by AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL as boto3 reads them.

A record `{"recordId", "modelInput"}` runs as one Anthropic message batch request whose params
are the modelInput without Bedrock's `anthropic_version`, with the job's model. Once the batch
has ended, each input record is written back, in input order, to
`{output}/{job id}/{input file name}.out` with `modelOutput` (the message) or `error`
(`errorCode`, `errorMessage`); a record that never ran (stopped, expired) gets none. A
`manifest.json.out` beside them sums the job up.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from lowtide.core import fastjson
from lowtide.core.errors import SourceError
from lowtide.core.locations import location
from lowtide.server.intake import Intake
from lowtide.server.translate import Rejection

ANTHROPIC_VERSION = "bedrock-2023-05-31"
# Anthropic's error types as the HTTP status a Bedrock error record carries.
ERROR_CODES = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403, "not_found_error": 404,
               "request_too_large": 413, "rate_limit_error": 429, "timeout_error": 408, "overloaded_error": 529}  # fmt: skip


class InputProblem(Exception):
    """The job's input cannot run: the job fails validation with this message."""


def input_files(uri: str) -> list[str]:
    """The JSONL files a job's input s3Uri names (a file, or a folder's .jsonl files)."""
    place = location(uri)
    try:
        found = [p for p in place.files() if p.endswith(".jsonl")]
    except SourceError as err:
        raise InputProblem(str(err)) from None
    if not found:
        raise InputProblem(f"{uri}: no .jsonl file; a batch inference job's input is JSONL files ending in .jsonl")
    return [f"s3://{p}" for p in found]


def records(uri: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) of one input file, streamed; a line that is not a record is an
    InputProblem naming it."""
    place = location(uri)
    try:
        with place.open_text(uri.removeprefix("s3://")) as f:
            for number, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                try:
                    record = json.loads(text)
                except ValueError:
                    raise InputProblem(f"{uri} line {number}: not valid JSON") from None
                if not isinstance(record, dict) or not isinstance(record.get("modelInput"), dict):
                    raise InputProblem(f"{uri} line {number}: a record is {{\"recordId\", \"modelInput\": {{...}}}}")
                yield number, record
    except SourceError as err:
        raise InputProblem(str(err)) from None


def record_id(uri: str, number: int) -> str:
    """An id for a record that came without one (Bedrock adds one: 11 characters), the same
    each time the file is read."""
    return hashlib.sha1(f"{uri}:{number}".encode()).hexdigest()[:11].upper()


def take(intake: Intake, uri: str, model: str, refuse) -> None:
    """Write one input file's records through `intake`, each as Anthropic params or as the
    rejection that record fails with alone. A recordId used twice fails the job."""
    seen: set[str] = set()
    for number, record in records(uri):
        rid = record.get("recordId")
        rid = rid if isinstance(rid, str) and rid else record_id(uri, number)
        if rid in seen:
            raise InputProblem(f"{uri} line {number}: recordId {rid!r} is used more than once; each record needs its own")
        seen.add(rid)
        intake.add(rid, model, params_of(record["modelInput"], model, refuse))


def params_of(model_input: dict[str, Any], model: str, refuse) -> dict[str, Any] | Rejection:
    version = model_input.get("anthropic_version")
    if version != ANTHROPIC_VERSION:
        return Rejection(f"anthropic_version: {ANTHROPIC_VERSION!r} is required, not {version!r}", param="anthropic_version")
    params = {"model": model} | {k: v for k, v in model_input.items() if k != "anthropic_version"}
    return refuse(params) or {"body": params}


def read_results(path) -> dict[str, dict[str, Any]]:
    """An ended batch's Anthropic results by custom_id (a cut line names none: left out)."""
    found: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return found
    with path.open(encoding="utf-8") as f:
        for text in f:
            try:
                line = json.loads(text)
                found[line["custom_id"]] = line["result"]
            except (ValueError, KeyError, TypeError):
                continue
    return found


def output_record(record: dict[str, Any], rid: str, result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The .out record of one input record, or None for one that never ran."""
    kind = (result or {}).get("type")
    head = {"recordId": rid, "modelInput": record["modelInput"]}
    if kind == "succeeded":
        return head | {"modelOutput": result["message"]}
    if kind == "errored":
        error = ((result.get("error") or {}).get("error")) or {}
        return head | {"error": {"errorCode": ERROR_CODES.get(error.get("type"), 500), "errorMessage": error.get("message") or "error"}}
    return None


def write_outputs(inputs: list[str], output: str, job_id: str, results: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Write each input file's .out and the manifest; return the manifest's counts."""
    folder = f"{output.rstrip('/')}/{job_id}"
    fs = location(folder).fs
    counts = dict.fromkeys(("totalRecordCount", "processedRecordCount", "successRecordCount", "errorRecordCount",
                            "inputTokenCount", "outputTokenCount"), 0)  # fmt: skip
    for uri in inputs:
        name = uri.rsplit("/", 1)[-1]
        with fs.open(f"{folder}/{name}.out".removeprefix("s3://"), "wb") as out:
            for number, record in records(uri):
                counts["totalRecordCount"] += 1
                rid = record.get("recordId")
                rid = rid if isinstance(rid, str) and rid else record_id(uri, number)
                line = output_record(record, rid, results.get(rid))
                if line is None:
                    continue
                counts["processedRecordCount"] += 1
                counts["successRecordCount" if "modelOutput" in line else "errorRecordCount"] += 1
                usage = (line.get("modelOutput") or {}).get("usage") or {}
                counts["inputTokenCount"] += usage.get("input_tokens") or 0
                counts["outputTokenCount"] += usage.get("output_tokens") or 0
                out.write(fastjson.dumpb(line) + b"\n")
    with fs.open(f"{folder}/manifest.json.out".removeprefix("s3://"), "wb") as out:
        out.write(fastjson.dumpb(counts))
    return counts
