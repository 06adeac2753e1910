"""Sources: CSV, JSONL and Parquet rows with their row and line numbers, in chunks."""

from __future__ import annotations

import json

import pytest

from lowtide.core.errors import SourceError, SpecError
from lowtide.core.sources import Source, SourceRow, open_file


def rows_of(source: Source, size: int = 5000) -> list[SourceRow]:
    return [r for chunk in source.chunks(size) for r in chunk]


def test_csv_quoted_commas_and_embedded_newlines_keep_row_and_line_numbers(tmp_path):
    text = (
        "id,body\n"  # line 1
        'A,"refund, please"\n'  # line 2: row 1
        'B,"first line\nsecond line\nthird"\n'  # lines 3-5: row 2
        "\n"  # line 6: blank, skipped
        'C,"say ""hi"""\n'  # line 7: row 3
        "D,plain\n"  # line 8: row 4
    )
    (tmp_path / "t.csv").write_text(text, encoding="utf-8")
    source = open_file(tmp_path / "t.csv")
    assert source.format == "csv" and source.columns == ["id", "body"]
    rows = rows_of(source)
    assert [(r.number, r.line) for r in rows] == [(1, 2), (2, 3), (3, 7), (4, 8)]
    assert rows[0].values == {"id": "A", "body": "refund, please"}
    assert rows[1].values["body"] == "first line\nsecond line\nthird"
    assert rows[2].values["body"] == 'say "hi"'
    assert rows[2].where(source.path) == "t.csv row 3 (line 7)"


def test_csv_row_after_a_multiline_value_with_wrong_width_names_its_line(tmp_path):
    (tmp_path / "t.csv").write_text('id,body\nA,"x\ny"\nB,1,2\n', encoding="utf-8")
    with pytest.raises(SourceError, match=r"t\.csv row 2 \(line 4\): has 3 fields, the header has 2"):
        rows_of(open_file(tmp_path / "t.csv"))


def test_a_malformed_record_takes_its_row_number_in_a_source_of_many_files(tmp_path):
    """Rows after a ragged CSV record (or a JSONL line that is no object) keep their numbers,
    in the file and in the files after it: a problem named the row before the one meant."""
    for folder, ext, first, second in (
        ("c", "csv", "id,body\nA,a\nB,b,x\nC,c\n", "id,body\nD,d\nE,e,x\n"),
        ("j", "jsonl", '{"id": "A"}\n[1]\n{"id": "C"}\n', '{"id": "D"}\n{"id": \n'),
    ):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"1.{ext}").write_text(first, encoding="utf-8")
        (tmp_path / folder / f"2.{ext}").write_text(second, encoding="utf-8")
        source = open_file(tmp_path / folder)
        rows = [r for chunk in source.chunks(strict=False) for r in chunk]
        assert [(r.values["id"], r.number, r.line) for r in rows] == [("A", 1, 1 + (ext == "csv")), ("C", 3, 3 + (ext == "csv")), ("D", 4, 1 + (ext == "csv"))]
        if ext == "csv":
            assert source.problems[1].startswith("2.csv row 5 (line 3): has 3 fields")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        # the lenient reader returned rows 2 and 3 inside row 1's cell, and nothing said so
        ('id,body\nA,"5 inch\nB,fine\nC,fine\n', r'row 1 \(line 2\): a quoted value starts in this row and is never closed'),
        ('id,body\nA,ok\nB,"5 inch\nC,"fine"\nD,x\n', r"row 2 \(line 3\): not valid CSV at line 4 \(',' expected after '\"'\)"),
    ],
)
def test_csv_quote_that_is_never_closed_is_refused_not_read_as_one_cell(tmp_path, text, problem):
    (tmp_path / "t.csv").write_text(text, encoding="utf-8")
    with pytest.raises(SourceError, match=r"t\.csv " + problem) as info:
        rows_of(open_file(tmp_path / "t.csv"))
    assert len(info.value.problems) == 1


def test_csv_quotes_that_are_valid_still_read(tmp_path):
    (tmp_path / "t.csv").write_text('id,body\nA,5" screen\nB,"say ""hi"""\n', encoding="utf-8")
    assert [r.values["body"] for r in rows_of(open_file(tmp_path / "t.csv"))] == ['5" screen', 'say "hi"']


def test_csv_header_with_an_unclosed_quote_or_a_blank_first_line(tmp_path):
    (tmp_path / "t.csv").write_text('id,"body\nA,x\n', encoding="utf-8")
    with pytest.raises(SourceError, match=r"^t\.csv line 1: the header row: a quoted value starts in this row and is never closed"):
        open_file(tmp_path / "t.csv")
    (tmp_path / "t.csv").write_text("\nid,body\nA,x\n", encoding="utf-8")
    with pytest.raises(SourceError, match=r"^t\.csv line 1: blank; a CSV source's first line is its header row"):
        open_file(tmp_path / "t.csv")


def test_csv_with_a_bom_and_padded_header(tmp_path):
    (tmp_path / "t.csv").write_bytes("\ufeffid , body\nA,x\n".encode())
    source = open_file(tmp_path / "t.csv")
    assert source.columns == ["id", "body"]  # no "\ufeffid": the BOM is not part of the name
    assert rows_of(source)[0].values == {"id": "A", "body": "x"}


def test_csv_crlf_line_endings(tmp_path):
    (tmp_path / "t.csv").write_bytes(b'id,body\r\nA,"x\r\ny"\r\nB,z\r\n')
    rows = rows_of(open_file(tmp_path / "t.csv"))
    assert [(r.number, r.line, r.values["id"]) for r in rows] == [(1, 2, "A"), (2, 4, "B")]


def test_csv_empty_file_needs_a_header(tmp_path):
    (tmp_path / "t.csv").write_text("", encoding="utf-8")
    with pytest.raises(SourceError, match=r"t\.csv: empty file; a CSV source needs a header row"):
        open_file(tmp_path / "t.csv")


def test_csv_header_only_has_no_rows(tmp_path):
    (tmp_path / "t.csv").write_text("id,body\n", encoding="utf-8")
    assert rows_of(open_file(tmp_path / "t.csv")) == []


def test_csv_chunks(tmp_path):
    (tmp_path / "t.csv").write_text("id\n" + "".join(f"{i}\n" for i in range(7)), encoding="utf-8")
    chunks = list(open_file(tmp_path / "t.csv").chunks(3))
    assert [len(c) for c in chunks] == [3, 3, 1]
    assert [r.number for c in chunks for r in c] == list(range(1, 8))


def test_jsonl_blank_lines_are_skipped_and_lines_kept(tmp_path):
    lines = ["", json.dumps({"id": 1, "body": "a"}), "   ", "", json.dumps({"id": "2", "tags": ["x"]}), ""]
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    source = open_file(tmp_path / "t.jsonl")
    assert source.columns is None
    rows = rows_of(source)
    assert [(r.number, r.line) for r in rows] == [(1, 2), (2, 5)]
    assert rows[0].values == {"id": 1, "body": "a"} and rows[1].values["tags"] == ["x"]
    assert rows[1].where("t.jsonl") == "t.jsonl row 2 (line 5)"


def test_ndjson_is_jsonl(tmp_path):
    (tmp_path / "t.ndjson").write_text('{"id": 1}\n', encoding="utf-8")
    source = open_file(tmp_path / "t.ndjson")
    assert source.format == "jsonl"
    assert rows_of(source)[0].where(source.path) == "t.ndjson row 1"  # line == row: not repeated


def test_jsonl_invalid_json_names_the_line(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"id": 1}\n\n{"id": 2,,}\n', encoding="utf-8")
    with pytest.raises(SourceError, match=r"t\.jsonl line 3: not valid JSON \(.*column \d+\)"):
        rows_of(open_file(tmp_path / "t.jsonl"))


@pytest.mark.parametrize("depth", [2_000, 100_000])
def test_jsonl_line_nested_too_deep_names_the_line(tmp_path, depth):
    """Deeper than orjson goes, the standard library recursed until a RecursionError."""
    deep = '{"id": 2, "body": ' + "[" * depth + "]" * depth + "}"
    (tmp_path / "t.jsonl").write_text('{"id": 1}\n' + deep + "\n", encoding="utf-8")
    with pytest.raises(SourceError, match=r"t\.jsonl line 2: not valid JSON \(nested more than 1,000 levels deep"):
        rows_of(open_file(tmp_path / "t.jsonl"))


def test_jsonl_line_that_is_not_an_object(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"id": 1}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(SourceError, match=r"t\.jsonl line 2: each line must be a JSON object, got list"):
        rows_of(open_file(tmp_path / "t.jsonl"))


def test_jsonl_with_a_bom_reads_like_csv_with_one(tmp_path):
    (tmp_path / "t.jsonl").write_bytes("\ufeff".encode() + b'{"id": 1}\n')
    assert rows_of(open_file(tmp_path / "t.jsonl"))[0].values == {"id": 1}


def test_parquet_chunks_and_types(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 12_345
    table = pa.table({"id": [f"P{i}" for i in range(n)], "score": list(range(n)), "note": [None] * n})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=4000)
    source = open_file(tmp_path / "t.parquet")
    assert source.format == "parquet" and source.columns == ["id", "score", "note"]
    chunks = list(source.chunks(5000))
    assert [len(c) for c in chunks] == [5000, 5000, 2345]
    rows = [r for c in chunks for r in c]
    assert [r.number for r in rows] == list(range(1, n + 1))
    assert rows[-1].values == {"id": f"P{n - 1}", "score": n - 1, "note": None}
    assert rows[0].line is None and rows[6].where(source.path) == "t.parquet row 7"


def test_parquet_that_is_not_parquet(tmp_path):
    (tmp_path / "t.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(SourceError, match=r"t\.parquet: cannot read as parquet"):
        open_file(tmp_path / "t.parquet")


def test_declared_format_overrides_the_extension(tmp_path):
    (tmp_path / "t.txt").write_text("id\nA\n", encoding="utf-8")
    source = open_file(tmp_path / "t.txt", "csv")
    assert [r.values for r in rows_of(source)] == [{"id": "A"}]
    with pytest.raises(SpecError, match='unknown file extension ".txt"'):
        open_file(tmp_path / "t.txt")


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(SourceError, match="no such file; check `source.path`"):
        open_file(tmp_path / "nope.csv")
    (tmp_path / "d.jsonl").mkdir()
    with pytest.raises(SourceError, match="an empty folder; put the data files in it"):
        open_file(tmp_path / "d.jsonl")


def test_non_utf8_header(tmp_path):
    (tmp_path / "t.csv").write_bytes(b"id,b\xf6dy\nA,x\n")
    with pytest.raises(SourceError, match=r"t\.csv line 1, column 5: not UTF-8 text; save the file as UTF-8"):
        open_file(tmp_path / "t.csv")


def test_non_utf8_jsonl_row(tmp_path):
    (tmp_path / "t.jsonl").write_bytes(b'{"id": "caf\xe9"}\n')
    source = open_file(tmp_path / "t.jsonl")  # JSONL is only read row by row
    with pytest.raises(SourceError, match="not UTF-8 text"):
        rows_of(source)


def test_label_and_name(tmp_path):
    (tmp_path / "t.csv").write_text("id\n", encoding="utf-8")
    source = open_file(str(tmp_path / "t.csv"))
    assert source.label == str(tmp_path / "t.csv") and source.name == "t.csv"


def test_csv_header_with_a_repeated_column_is_refused(tmp_path):
    (tmp_path / "t.csv").write_text("id,body,body\nA,first,second\n", encoding="utf-8")
    with pytest.raises(SourceError, match='"body"'):
        rows_of(open_file(tmp_path / "t.csv"))


def test_parquet_with_a_repeated_column_name_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    # rows are read as dicts: the second "body" silently replaced the first
    table = pa.Table.from_arrays([pa.array(["A"]), pa.array(["x"]), pa.array(["y"])], names=["id", "body", "body"])
    pq.write_table(table, tmp_path / "t.parquet")
    with pytest.raises(SourceError, match=r'^t\.parquet schema names "body" more than once; give each column its own name'):
        open_file(tmp_path / "t.parquet")


def test_a_csv_cell_larger_than_the_csv_modules_default_limit_is_read_whole(tmp_path):
    from lowtide.core.sources import open_file

    document = "word " * 60_000  # 300,000 characters: over the csv module's 131,072
    path = tmp_path / "docs.csv"
    path.write_text(f'id,text\n1,"{document}"\n', encoding="utf-8")
    [[row]] = list(open_file(path).chunks())
    assert row.values["text"] == document
