"""`lowtide run --json`: the final status whole, placement included; the table, which shows
no placement, has its final status read without that pass over every row of the job."""

from __future__ import annotations

import json

from tests.cli.test_cli import cli, status_row, write_job  # noqa: F401  (cli: the fixture)


def test_run_json_has_placement_and_the_table_its_counts(cli, tmp_path):  # noqa: F811
    write_job(tmp_path, rows=3)
    code, out = cli("run", "job.yaml", "--json")
    assert code == 0, out
    shown = json.loads(out[out.index("{\n"):])  # after the progress lines (stderr, merged here)
    assert shown["placement"] == [{"route": "echo", "why": None, "state": "succeeded", "requests": 3}]
    assert shown["requests"]["succeeded"] == 3 and shown["done"] is True
    code, out = cli("run", "job.yaml")  # nothing new: the table of the same job
    assert code == 0, out
    assert status_row(out)["succeeded"] == "3" and status_row(out)["state"] == "finished"
