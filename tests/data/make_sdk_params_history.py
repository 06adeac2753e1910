"""Writes tests/data/sdk_params_history.json: for each request endpoint, every top-level
body key that a release of the openai or anthropic SDK from the last 12 months declared,
with the first and last of those releases that declared it.

    .venv/bin/python tests/data/make_sdk_params_history.py            # the last 365 days
    .venv/bin/python tests/data/make_sdk_params_history.py --days 400

A release's wheel is fetched with `pip download --no-deps` (into a temporary folder, one
at a time) and its request TypedDicts are read with `ast`, not imported: an old release
needs none of its dependencies here. Release dates come from PyPI's JSON API. Not every
release is fetched (openai ships about two a week): the first and last of the window are,
and between two fetched releases whose key sets differ the middle one is, until the change
is pinned to two neighbours; a key added and removed again between two fetched releases
with equal key sets would be missed. The test that reads the file
(tests/routes/test_undeclared_params.py) never downloads.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

OUT = Path(__file__).with_name("sdk_params_history.json")
# endpoint -> (module path in the wheel, the TypedDict of the request body)
TYPES = {
    "openai": {
        "/v1/chat/completions": ("openai/types/chat/completion_create_params.py", "CompletionCreateParamsBase"),
        "/v1/responses": ("openai/types/responses/response_create_params.py", "ResponseCreateParamsBase"),
        "/v1/completions": ("openai/types/completion_create_params.py", "CompletionCreateParamsBase"),
        "/v1/embeddings": ("openai/types/embedding_create_params.py", "EmbeddingCreateParams"),
    },
    "anthropic": {
        "/v1/messages": ("anthropic/types/message_create_params.py", "MessageCreateParamsBase"),
    },
}


def releases(package: str, since: datetime) -> list[str]:
    """The package's final releases uploaded since `since`, oldest first."""
    with urllib.request.urlopen(f"https://pypi.org/pypi/{package}/json", timeout=60) as response:
        data = json.load(response)
    out = []
    for name, files in data["releases"].items():
        wheels = [f for f in files if f["packagetype"] == "bdist_wheel" and not f.get("yanked")]
        if not wheels or any(c.isalpha() for c in name.replace(".", "")):  # no wheel, or a pre-release
            continue
        uploaded = min(datetime.fromisoformat(f["upload_time_iso_8601"].replace("Z", "+00:00")) for f in wheels)
        if uploaded >= since:
            out.append((uploaded, name))
    return [name for _, name in sorted(out)]


def keys_of(source: str, cls: str) -> list[str]:
    """The wire keys a TypedDict class declares: its annotated names, or their `alias`."""
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    keys = []
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            alias = next((kw.value.value for call in ast.walk(item.annotation) if isinstance(call, ast.Call)
                          for kw in call.keywords if kw.arg == "alias" and isinstance(kw.value, ast.Constant)), None)  # fmt: skip
            keys.append(alias or item.target.id)
    return keys


def declared(package: str, release: str, folder: Path) -> dict[str, list[str]]:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", str(folder),
         f"{package}=={release}"],
        check=True,
    )  # fmt: skip
    (wheel,) = folder.glob(f"{package}-{release}-*.whl")
    out = {}
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for endpoint, (path, cls) in TYPES[package].items():
            if path in names:
                out[endpoint] = keys_of(z.read(path).decode(), cls)
    wheel.unlink()
    return out


def bisected(package: str, versions: list[str], folder: Path) -> dict[int, dict[str, list[str]]]:
    """The key sets of the releases fetched (by index into `versions`; see the module doc)."""
    seen: dict[int, dict[str, list[str]]] = {}

    def at(i: int) -> dict[str, frozenset[str]]:
        if i not in seen:
            print(f"{package} {versions[i]}", file=sys.stderr)
            seen[i] = declared(package, versions[i], folder)
        return {e: frozenset(k) for e, k in seen[i].items()}

    spans = [(0, len(versions) - 1)]
    while spans:
        lo, hi = spans.pop()
        if hi - lo > 1 and at(lo) != at(hi):
            mid = (lo + hi) // 2
            at(mid)
            spans += [(lo, mid), (mid, hi)]
    at(0)
    at(len(versions) - 1)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=365)
    args = parser.parse_args()
    since = datetime.now(UTC) - timedelta(days=args.days)
    history: dict = {"since": since.date().isoformat(), "sdks": {}}
    for package in TYPES:
        versions = releases(package, since)
        with tempfile.TemporaryDirectory() as tmp:
            seen = bisected(package, versions, Path(tmp))
        found: dict[str, dict[str, list[str]]] = {}
        for i in sorted(seen):  # a key's span: the first and last fetched release declaring it
            for endpoint, keys in seen[i].items():
                for key in keys:
                    span = found.setdefault(endpoint, {}).setdefault(key, [versions[i], versions[i]])
                    span[1] = versions[i]
        history["sdks"][package] = {
            "releases": {"first": versions[0], "last": versions[-1], "in_window": len(versions), "fetched": len(seen)},
            "endpoints": {e: dict(sorted(keys.items())) for e, keys in sorted(found.items())},
        }
    OUT.write_text(json.dumps(history, indent=1) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
