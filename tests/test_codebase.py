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


# A request's state is decided in one module (engine/fate.py, DESIGN "How they are kept"):
# only it may call the request moves of store/transitions.py. serve's fault plan, which
# plays a provider expiring a batch, moves its own store's requests as the provider would.
REQUEST_MOVES = ("move_requests", "settle_dispatched", "start_new_version")
MAY_MOVE_REQUESTS = {"src/lowtide/store/transitions.py", "src/lowtide/engine/fate.py", "src/lowtide/server/lifecycle.py"}


def test_only_the_fate_module_moves_requests():
    import ast

    offenders = []
    for path in sorted((ROOT / "src").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in MAY_MOVE_REQUESTS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module == "lowtide.store.transitions":
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Attribute) and node.attr in REQUEST_MOVES:
                names = [node.attr]
            offenders += [f"{rel}:{node.lineno} {n}" for n in names if n in REQUEST_MOVES]
    assert not offenders, "a request's state changes only through lowtide.engine.fate:\n" + "\n".join(offenders)


def test_the_python_api_does_not_import_the_command_line():
    """api.py and evals_api.py are the package's other face: what they share with the CLI
    (progress, an eval's variant rows) lives below both, in engine/."""
    import ast

    for name in ("api.py", "evals_api.py"):
        tree = ast.parse((ROOT / "src" / "lowtide" / name).read_text(encoding="utf-8"))
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m.startswith("lowtide.cli")], name
