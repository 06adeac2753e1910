"""docs/support.md is what `lowtide.routes.support` computes from the SDKs' types and the
routes' own checks: it cannot drift from the code."""

from pathlib import Path

from lowtide.routes.support import markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "support.md"


def test_the_support_table_in_the_docs_is_current():
    assert DOC.read_text(encoding="utf-8") == markdown(), (
        "docs/support.md is out of date: run `python -m lowtide.routes.support > docs/support.md`"
    )
