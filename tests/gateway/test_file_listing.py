"""Issue 34 N11: a tenant listing its files is served from the gateway's records and the
documents it has seen (documents.py), not one upstream call per file on the shared key. The
upstream here is a real loopback server that counts every read of a file."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from typing import Any

import openai
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .conftest import KEYS, base_config, running_gateway, serving


class FilesUpstream:
    """OpenAI's files endpoints, enough of them: create, retrieve (counted), delete."""

    def __init__(self) -> None:
        self.url = ""
        self.files: dict[str, dict[str, Any]] = {}
        self.reads: Counter[str] = Counter()
        self._ids = itertools.count(1)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/files")
        async def create(request: Request) -> Any:
            body = await request.body()
            expires = int(time.time()) - 10 if b"expired.jsonl" in body else None  # one already past its expiry
            file_id = f"file-{next(self._ids):04d}"
            self.files[file_id] = {"id": file_id, "object": "file", "bytes": len(body), "created_at": int(time.time()),
                                   "filename": "in.jsonl", "purpose": "batch", "status": "processed", "expires_at": expires}  # fmt: skip
            return self.files[file_id]

        @app.get("/v1/files/{file_id}")
        async def retrieve(file_id: str) -> Any:
            self.reads[file_id] += 1
            if file_id not in self.files:
                return JSONResponse({"error": {"message": "No such File object", "type": "invalid_request_error"}}, status_code=404)
            return self.files[file_id]

        @app.delete("/v1/files/{file_id}")
        async def delete(file_id: str) -> Any:
            self.files.pop(file_id, None)
            return {"id": file_id, "object": "file", "deleted": True}

        return app


def test_listing_files_reads_each_from_the_upstream_at_most_once(tmp_path):
    up = FilesUpstream()
    with serving(up.app()) as url:
        up.url = url
        config = base_config(tmp_path, up)
        with running_gateway(tmp_path, config) as g:
            acme = openai.OpenAI(base_url=f"{g.url}/v1", api_key=KEYS["acme"], max_retries=0)
            globex = openai.OpenAI(base_url=f"{g.url}/v1", api_key=KEYS["globex"], max_retries=0)
            mine = [acme.files.create(file=(f"{i}.jsonl", b"{}\n"), purpose="batch").id for i in range(30)]
            theirs = globex.files.create(file=("g.jsonl", b"{}\n"), purpose="batch").id
            for _ in range(3):
                assert [f.id for f in acme.files.list(limit=100).data] == mine[::-1]
            assert sum(up.reads.values()) == 0  # every document came with its create's answer
            acme.files.delete(mine[0])
            assert [f.id for f in acme.files.list(limit=100).data] == mine[:0:-1]
        with running_gateway(tmp_path, config) as g:  # a restart: nothing known but the records
            acme = openai.OpenAI(base_url=f"{g.url}/v1", api_key=KEYS["acme"], max_retries=0)
            expired = acme.files.create(file=("expired.jsonl", b"{}\n"), purpose="batch").id
            for _ in range(3):
                assert [f.id for f in acme.files.list(limit=100).data] == mine[:0:-1]  # the expired one is not listed
            globex = openai.OpenAI(base_url=f"{g.url}/v1", api_key=KEYS["globex"], max_retries=0)
            assert [f.id for f in globex.files.list().data] == [theirs]
    assert set(up.reads) == set(mine[1:]) | {theirs} and set(up.reads.values()) == {1}  # once each, after the restart
    assert expired not in up.reads and mine[0] not in up.reads
