"""`lowtide results` for an embedding job, through the installed command: Parquet
fixed_size_list<float32>, JSONL arrays, .npy plus its ids file, and a PostgreSQL table
upserted by business key (only new or changed rows written)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
import yaml

from tests.cli.test_cli import cli  # noqa: F401  (the fixture)
from tests.cli.test_delete_cli import _ended_an_hour_ago
from tests.conftest import _pg_available, fresh_pg_schema, write_csv
from tests.embeddings.helpers import docs, docs_csv, echo_reference, embed_spec


def f32(values: list[float]) -> list[float]:
    return [struct.unpack("<f", struct.pack("<f", v))[0] for v in values]


def write_job(folder, n: int, **extra):
    docs_csv(folder / "docs.csv", n)
    spec = embed_spec("docs.csv", **extra)
    (folder / "job.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")


def texts(n: int) -> dict[str, str]:
    return {f"doc-{i}": f"document number {i} about topic {i % 7}" for i in range(1, n + 1)}


def test_vectors_as_parquet_jsonl_and_npy(cli, tmp_path):  # noqa: F811
    write_job(tmp_path, 12)
    code, out = cli("run", "job.yaml")
    assert code == 0, out
    for name in ("v.parquet", "v.jsonl", "v.npy"):
        code, out = cli("results", "vectors", "--out", name)
        assert code == 0 and "12 succeeded" in out, out
    want = {k: f32(echo_reference(t, 8)) for k, t in texts(12).items()}
    table = pq.read_table(tmp_path / "v.parquet")
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 8)
    assert dict(zip(table.column("doc_id").to_pylist(), table.column("embedding").to_pylist(), strict=True)) == want
    lines = [json.loads(x) for x in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert {x["doc_id"]: x["embedding"] for x in lines} == want and {x["state"] for x in lines} == {"succeeded"}
    matrix = np.load(tmp_path / "v.npy")
    ids = (tmp_path / "v.ids.txt").read_text().splitlines()
    assert matrix.dtype == np.float32 and matrix.shape == (12, 8)
    assert {k: row.tolist() for k, row in zip(ids, matrix, strict=True)} == want


def test_a_csv_out_file_is_refused_with_the_formats_that_work(cli, tmp_path):  # noqa: F811
    write_job(tmp_path, 2)
    assert cli("run", "job.yaml")[0] == 0
    code, out = cli("results", "vectors", "--out", "v.csv")
    assert code != 0 and ".parquet, .jsonl, .npy" in out


@pytest.mark.postgres
def test_postgres_table_upserted_by_business_key(cli, tmp_path):  # noqa: F811
    if not _pg_available():
        pytest.skip("PostgreSQL is not reachable")
    with fresh_pg_schema("lowtide_vec") as url:
        write_job(tmp_path, 5)
        assert cli("run", "job.yaml")[0] == 0
        code, out = cli("results", "vectors", "--pg-url", url, "--pg-table", "doc_vectors")
        assert code == 0 and "5 row(s) new or changed" in out, out
        code, out = cli("results", "vectors", "--pg-url", url, "--pg-table", "doc_vectors")
        assert "0 row(s) new or changed" in out, out  # nothing changed: nothing written
        write_job(tmp_path, 7)  # two new documents
        assert cli("run", "job.yaml")[0] == 0
        code, out = cli("results", "vectors", "--pg-url", url, "--pg-table", "doc_vectors")
        assert "2 row(s) new or changed" in out, out
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            got = dict(conn.execute(sa.text("select id, embedding from doc_vectors")).all())
        engine.dispose()
    # float4 values: the same float32 numbers (PostgreSQL prints them shortest-first)
    assert {k: f32(v) for k, v in got.items()} == {k: f32(echo_reference(t, 8)) for k, t in texts(7).items()}


def test_estimate_prints_what_packing_does_to_the_request_count(cli, tmp_path):  # noqa: F811
    write_job(tmp_path, 5000, route="openai-batch", route_options={"base_url": "http://127.0.0.1:9/v1"})
    code, out = cli("estimate", "job.yaml", "--json")
    assert code == 0, out
    got = json.loads(out)
    assert got["output_tokens"] == 0 and got["input_tokens"] > 0
    assert got["provider_requests"] == {"packing": True, "rows": 5000, "packed_requests": 3, "packed_batches": 1,
                                        "unpacked_requests": 5000, "unpacked_batches": 1}  # fmt: skip
    batch = next(r for r in got["routes"] if r["route"] == "openai-batch")
    assert batch["this_job"] and batch["tier"] == "batch"
    code, out = cli("estimate", "job.yaml")
    assert "5,000 rows in 3 provider requests" in out and "priced per input token" in out


def test_run_writes_an_npy_output_and_refuses_a_csv_one_before_running(cli, tmp_path):  # noqa: F811
    write_job(tmp_path, 3)
    code, out = cli("run", "job.yaml", "--out", "v.csv")
    assert code != 0 and ".parquet, .jsonl or .npy" in out and not (tmp_path / "v.csv").exists()
    code, out = cli("run", "job.yaml", "--out", "v.npy")
    assert code == 0, out
    assert np.load(tmp_path / "v.npy").shape == (3, 8) and (tmp_path / "v.ids.txt").read_text().split() == ["doc-1", "doc-2", "doc-3"]


def change_doc_2(folder) -> None:
    """doc-2's text changes under the same id (the nightly source of a changed row)."""
    rows = docs(3)
    rows[1]["text"] = "a completely different text"
    write_csv(folder / "docs.csv", rows)


def test_a_row_changed_since_its_vector_is_marked_source_changed(cli, tmp_path):  # noqa: F811
    write_job(tmp_path, 3)
    assert cli("run", "job.yaml")[0] == 0
    change_doc_2(tmp_path)
    code, out = cli("run", "job.yaml")  # the nightly run keeps the changed row with its old vector
    assert code == 0 and "1 row(s) changed since they were stored" in out, out
    for name in ("v.parquet", "v.jsonl"):
        code, out = cli("results", "vectors", "--out", name)
        assert code == 0, out
    table = pq.read_table(tmp_path / "v.parquet")
    assert table.schema.field("source_changed").type == pa.bool_()
    got = {r["doc_id"]: r["source_changed"] for r in table.to_pylist()}
    assert got == {"doc-1": False, "doc-2": True, "doc-3": False}
    lines = [json.loads(x) for x in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert {x["doc_id"]: x["source_changed"] for x in lines} == got
    # a .npy cannot mark a row: refused, naming the row and what to do
    code, out = cli("results", "vectors", "--out", "v.npy")
    assert code != 0 and "doc-2" in out and "--requeue-changed" in out and not (tmp_path / "v.npy").exists(), out
    # re-run, the vector is the new text's and nothing is marked
    assert cli("run", "job.yaml", "--requeue-changed")[0] == 0
    assert cli("results", "vectors", "--out", "v.parquet")[0] == 0
    rows = {r["doc_id"]: r for r in pq.read_table(tmp_path / "v.parquet").to_pylist()}
    assert not any(r["source_changed"] for r in rows.values())
    assert rows["doc-2"]["embedding"] == f32(echo_reference("a completely different text", 8))
    assert cli("results", "vectors", "--out", "v.npy")[0] == 0


@pytest.mark.postgres
def test_postgres_table_marks_a_changed_row(cli, tmp_path):  # noqa: F811
    if not _pg_available():
        pytest.skip("PostgreSQL is not reachable")
    with fresh_pg_schema("lowtide_vec") as url:
        write_job(tmp_path, 3)
        assert cli("run", "job.yaml")[0] == 0
        assert cli("results", "vectors", "--pg-url", url, "--pg-table", "doc_vectors")[0] == 0
        change_doc_2(tmp_path)
        assert cli("run", "job.yaml")[0] == 0
        code, out = cli("results", "vectors", "--pg-url", url, "--pg-table", "doc_vectors")
        assert code == 0 and "1 row(s) new or changed" in out and "1 row(s) source_changed" in out, out
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            got = dict(conn.execute(sa.text("select id, source_changed from doc_vectors")).all())
        engine.dispose()
        assert got == {"doc-1": False, "doc-2": True, "doc-3": False}


@pytest.mark.parametrize("how", ["--keep-results", "retention"])
def test_a_prune_that_keeps_the_results_keeps_the_vectors(cli, tmp_path, how):  # noqa: F811
    """An embedding job's answer is its vector, read from the stored response: `prune
    --keep-results`, and a job's `retention: payloads:` past due (which keeps the answers),
    drop the payloads and keep the vectors."""
    write_job(tmp_path, 6, **({"retention": {"payloads": "1s"}} if how == "retention" else {}))
    assert cli("run", "job.yaml")[0] == 0
    _ended_an_hour_ago(tmp_path / "lowtide.db")
    want = {k: f32(echo_reference(t, 8)) for k, t in texts(6).items()}
    code, out = cli("prune", *(["--older-than", "1s", "--keep-results"] if how == "--keep-results" else []), "--yes")
    assert code == 0 and "pruned 1 job(s)" in out, out
    code, out = cli("results", "vectors", "--out", "v.parquet")
    assert code == 0 and "6 succeeded" in out, out
    table = pq.read_table(tmp_path / "v.parquet")
    assert dict(zip(table.column("doc_id").to_pylist(), table.column("embedding").to_pylist(), strict=True)) == want
