"""Taking a batch in: checking an OpenAI input file line by line, and writing every request
into the batch's folder as lowtide source rows (one file per model) or as a rejection.

A row is the request's body exactly as it came, `{"custom_id", "body": {...}}`: the job
reads it with `template.body_column` and stores it verbatim (DESIGN invariant 8). The folder
(`batches/<batch id>/` in the data dir) then holds:

    <job name>.jsonl   source rows of one lowtide job (the batch id, then `<id>.1`, … per model)
    rejected.jsonl     requests that fail alone, before running (a field the backend refuses)
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from lowtide.core import fastjson
from lowtide.server import safejson
from lowtide.server.translate import Rejection, encode_key

MAX_ERRORS = 100  # validation errors reported for one file
_dumps = fastjson.dumps


@dataclass(slots=True)
class Intake:
    """Writes a batch's requests into its folder. Use as a context manager."""

    folder: Path
    batch_id: str
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # API model -> {"name", "model", "rows"}
    total: int = 0
    rejected: int = 0
    _files: dict[str, IO[str]] = field(default_factory=dict)

    def __enter__(self) -> Intake:
        if self.folder.exists():  # a half-written try from before a crash
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True)
        return self

    def __exit__(self, *exc) -> None:
        for f in self._files.values():
            f.close()

    def add(self, custom_id: str, model: str, row: dict[str, Any] | Rejection) -> None:
        self.total += 1
        if "\x00" in model:  # no model has one, and the store's text columns cannot hold it
            row, model = Rejection("model: it holds a NUL character, which no model name has", param="model"), ""
        if isinstance(row, Rejection):
            self.rejected += 1
            self._write("rejected", row.to_json(custom_id) | {"model": model})
            return
        job = self.jobs.get(model)
        if job is None:
            name = self.batch_id if not self.jobs else f"{self.batch_id}.{len(self.jobs)}"
            job = self.jobs[model] = {"name": name, "model": model, "rows": 0}
        job["rows"] += 1
        self._write(job["name"], {"custom_id": encode_key(custom_id), **row})

    def _write(self, name: str, record: dict[str, Any]) -> None:
        f = self._files.get(name)
        if f is None:
            f = self._files[name] = (self.folder / f"{name}.jsonl").open("w", encoding="utf-8")
        f.write(_dumps(record) + "\n")

    def discard(self) -> None:
        self.__exit__()
        shutil.rmtree(self.folder, ignore_errors=True)


def _error(code: str, message: str, line: int | None = None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def check_size(nbytes: int, max_bytes: int) -> list[dict[str, Any]]:
    if nbytes > max_bytes:
        return [_error("file_too_large", f"The input file is {nbytes:,} bytes; a batch input file may be at most {max_bytes:,} bytes.")]
    return []


def take_openai_file(
    path: Path, intake: Intake, endpoint: str, max_requests: int, refuse: Callable[[dict[str, Any]], Rejection | None],
    max_depth: int = safejson.DEFAULT_DEPTH,
) -> tuple[str | None, list[dict[str, Any]]]:
    """Check every line of an input file as OpenAI's validation does, writing the good ones
    through `intake`: as a row, or as the `refuse(body)` rejection that line fails with
    alone. Returns (the model, the validation errors: empty when it passed)."""
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    model: str | None = None
    count = 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            count += 1
            if count > max_requests:
                return model, [_error("too_many_tasks", f"The batch has more than {max_requests:,} requests; the limit is {max_requests:,}. Split the file.")]
            line = _check_line(raw, lineno, endpoint, max_depth)
            if isinstance(line, dict) and "code" in line:
                errors.append(line)
            else:
                custom_id, body = line
                if custom_id in seen:
                    errors.append(_error("duplicate_custom_id", f"The custom_id '{custom_id}' is used more than once; each request in a batch needs its own custom_id.", lineno, "custom_id"))
                seen.add(custom_id)
                if model is None:
                    model = body["model"]
                elif body["model"] != model:
                    errors.append(_error("model_mismatch", f"The model '{body['model']}' differs from '{model}' of line 1; a batch may use only one model.", lineno, "body.model"))
                if not errors:
                    intake.add(custom_id, model, refuse(body) or {"body": body})
            if len(errors) >= MAX_ERRORS:
                break
    if count == 0:
        return None, [_error("empty_file", "The input file is empty; it needs at least one request line.")]
    return model, errors


def _check_line(raw: bytes, lineno: int, endpoint: str, max_depth: int) -> tuple[str, dict] | dict[str, Any]:
    try:
        item = safejson.loads(raw, max_depth)
    except safejson.TooDeep as err:
        return _error("invalid_json_line", f"This line is {err}; a request may nest at most {max_depth} levels.", lineno, err.path or None)
    except safejson.NotText as err:  # the store and the output files could not carry it
        return _error("invalid_request", f"This line's {err}; send valid Unicode.", lineno, err.path or None)
    except safejson.NotFinite as err:
        return _error("invalid_json_line", f"This line is not parseable as valid JSON: {err}.", lineno, err.path or None)
    except ValueError:  # json.JSONDecodeError, UnicodeDecodeError
        return _error("invalid_json_line", "This line is not parseable as valid JSON.", lineno)
    if not isinstance(item, dict):
        return _error("invalid_json_line", "Each line must be a JSON object.", lineno)
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str):
        what = "Missing required parameter" if custom_id is None else "Invalid type for"
        return _error("invalid_request", f"{what}: 'custom_id' (a string).", lineno, "custom_id")
    if item.get("method") != "POST":
        return _error("invalid_request", "The method of each request must be 'POST'.", lineno, "method")
    if item.get("url") != endpoint:
        return _error("url_mismatch", f"The url '{item.get('url')}' does not match the batch's endpoint '{endpoint}'.", lineno, "url")
    body = item.get("body")
    if not isinstance(body, dict):
        return _error("invalid_request", "Missing required parameter: 'body' (a JSON object).", lineno, "body")
    if not isinstance(body.get("model"), str) or not body["model"]:
        return _error("invalid_request", "Missing required parameter: 'body.model'.", lineno, "body.model")
    if "\x00" in body["model"]:  # no model has one, and PostgreSQL's text cannot hold it
        return _error("invalid_request", "Invalid 'body.model': it holds a NUL character.", lineno, "body.model")
    return custom_id, body
