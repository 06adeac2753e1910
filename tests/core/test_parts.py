"""Images and files a template adds (core/parts.py): every cell form, for every endpoint,
makes a part the endpoint's SDK type takes; bad media is refused with the fix."""

from __future__ import annotations

import base64
import typing
from pathlib import Path

import pytest

from lowtide.core import shapes
from lowtide.core.endpoints import CHAT, MESSAGES, RESPONSES
from lowtide.core.parts import LIMITS, MB, PARTS, PartError, PartMaker
from tests.core.test_request_shapes import user_parts

# A 1x1 PNG, and the smallest PDF header puremagic knows.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")
PDF = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"
ENDPOINTS = (CHAT, RESPONSES, MESSAGES)


def user_part_union(endpoint: str):
    return typing.Union[tuple(user_parts(endpoint).values())]  # noqa: UP007 - built at run time


@pytest.fixture
def media(tmp_path: Path) -> Path:
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(PNG)
    (tmp_path / "c.pdf").write_bytes(PDF)
    return tmp_path


def forms(kind: str, folder: Path) -> dict[str, object]:
    data, path = (PNG, "img/a.png") if kind == "image" else (PDF, "c.pdf")
    mime = "image/png" if kind == "image" else "application/pdf"
    return {
        "path": path,
        "absolute path": str(folder / path),
        "base64": base64.b64encode(data).decode(),
        "data url": f"data:{mime};base64,{base64.b64encode(data).decode()}",
        "bytes": data,
        "url": f"https://example.com/{path}",
    }


CASES = [(e, k, f) for e in ENDPOINTS for k in ("image", "file") for f in forms(k, Path("."))]


@pytest.mark.parametrize(("endpoint", "kind", "form"), CASES, ids=[f"{e}-{k}-{f}" for e, k, f in CASES])
def test_every_cell_form_makes_a_part_the_endpoint_takes(media, endpoint, kind, form):
    maker = PartMaker(kind, "col", endpoint, media, "low" if kind == "image" and endpoint != MESSAGES else None)
    value = forms(kind, media)[form]
    if endpoint == CHAT and kind == "file" and form == "url":
        with pytest.raises(PartError, match="chat/completions file parts take the file itself"):
            maker(value)
        return
    part = maker(value)
    assert part["type"] == PARTS[endpoint][kind]
    assert shapes.problem(part, user_part_union(endpoint), "part") is None
    flat = repr(part)
    if form == "url":
        assert value in flat
    else:  # inlined: the bytes themselves, as base64, with the sniffed type
        data = PNG if kind == "image" else PDF
        assert base64.b64encode(data).decode() in flat
        assert ("image/png" if kind == "image" else "application/pdf") in flat


def test_a_missing_file_names_the_path_and_the_folder(media):
    with pytest.raises(PartError, match=r"no such file: .*img/b\.png \(paths are relative to the spec's folder\)"):
        PartMaker("image", "col", CHAT, media)("img/b.png")


def test_what_is_not_an_image_is_refused_with_what_it_looks_like(media):
    with pytest.raises(PartError, match=r"is not an image \(its bytes look like application/pdf\); images must be image/png"):
        PartMaker("image", "col", CHAT, media)("c.pdf")
    with pytest.raises(PartError, match=r"is not an image \(its bytes are no known type\)"):
        PartMaker("image", "col", CHAT, media)(b"just some text, no picture")
    with pytest.raises(PartError, match=r"is not a PDF"):
        PartMaker("file", "col", MESSAGES, media)("img/a.png")
    with pytest.raises(PartError, match=r"no such file: .*, and not a URL or base64"):
        PartMaker("image", "col", CHAT, media)("not base64 at all!")
    with pytest.raises(PartError, match=r"is not a URL, a file or base64 \(the cell does not decode\)"):
        PartMaker("image", "col", CHAT, media)("QUJD" * 10 + "A")


@pytest.mark.parametrize(("endpoint", "provider"), [(CHAT, "openai"), (MESSAGES, "anthropic")])
def test_an_image_over_the_providers_limit_is_refused(media, endpoint, provider):
    limit = LIMITS[(provider, "image")]
    # Over the limit by a little: Anthropic's is on the base64 text, 4/3 of the bytes.
    size = limit * 3 // 4 + 1024 if provider == "anthropic" else limit + 1
    (media / "big.png").write_bytes(PNG + b"\0" * (size - len(PNG)))
    with pytest.raises(PartError, match=rf"over {provider}'s limit of {limit // MB} MB per image; make it smaller, or pass a URL"):
        PartMaker("image", "col", endpoint, media)("big.png")
    (media / "ok.png").write_bytes(PNG + b"\0" * (limit * 3 // 4 - 1024 - len(PNG)))
    assert PartMaker("image", "col", endpoint, media)("ok.png")["type"] == PARTS[endpoint]["image"]
