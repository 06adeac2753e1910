"""Where a spec may write (issue 34): `output.path` inside the spec's own folder, never
outside it (absolute, `..`, or through a link); `--out` writes anywhere the user says."""

from __future__ import annotations

import os

import pytest

from lowtide.core.errors import SpecError
from lowtide.core.output_target import spec_output
from lowtide.core.spec import build_spec
from tests.cli.test_cli import Cli, write_job


def _spec(base, path):
    return build_spec({"name": "t", "source": {"path": "t.csv", "id_column": "id"}, "template": {"user": "{{ x }}"},
                       "model": "m", "route": "echo", "base_dir": str(base), "output": {"path": path}})  # fmt: skip


@pytest.mark.parametrize("path", ["results.csv", "out/results.csv", "out/../results.csv", "{base}/deep/results.jsonl"])
def test_a_path_inside_the_specs_folder_is_taken(tmp_path, path):
    assert spec_output(_spec(tmp_path, path.format(base=tmp_path))) == _spec(tmp_path, path.format(base=tmp_path)).resolve(path.format(base=tmp_path))


@pytest.mark.parametrize("path", ["../results.csv", "out/../../results.csv", "/tmp/results.csv", "~/.bashrc", "link/results.csv"])
def test_a_path_leading_out_of_the_specs_folder_is_refused_naming_the_fix(tmp_path, path):
    base = tmp_path / "job"
    base.mkdir()
    os.symlink(tmp_path, base / "link")  # a link inside that leads out
    with pytest.raises(SpecError) as caught:
        spec_output(_spec(base, path))
    assert str(caught.value).startswith(f"output.path {path}: a spec writes only inside its own folder ({base})")
    assert "pass --out to write elsewhere" in str(caught.value)


def test_run_refuses_a_spec_writing_outside_its_folder_before_any_request_and_out_overrides_it(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    write_job(folder, output={"path": "../stolen.csv"})
    cli = Cli(folder, str(tmp_path / "lowtide.db"))
    code, out = cli("run", "job.yaml")
    assert code == 2 and "output.path ../stolen.csv: a spec writes only inside its own folder" in out, out
    assert not (tmp_path / "stolen.csv").exists() and not (tmp_path / "lowtide.db").exists()  # nothing ran
    code, out = cli("run", "job.yaml", "--out", str(tmp_path / "mine.csv"))  # the user's own choice
    assert code == 0 and (tmp_path / "mine.csv").exists(), out
