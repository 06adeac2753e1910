"""The codebase keeps its own rules: ruff-clean, and layers import only the layers below."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ROOT.parent / "shared" / "tools" / "layers.py"


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    result = subprocess.run([ruff, "check", "src", "tests", "bench"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.mark.skipif(not LAYERS.exists(), reason="../shared/tools/layers.py is not beside this checkout")
def test_layers_import_only_the_layers_below():
    result = subprocess.run([sys.executable, str(LAYERS), str(ROOT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
