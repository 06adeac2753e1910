"""Headless Chromium for the dashboard's tests: the system's `chromium`, driven by
Playwright (no browser download; CI installs Debian's `chromium`, .ci/run). Without it the
tests skip locally and fail in CI. Also the structural checks of a page's layout: element
boxes, overlaps, overflow and visibility, never pixels."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

WAIT_MS = 20_000  # a bound for the page to catch up, not a timing


def _missing(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI installs it: .ci/run)")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed: pip install -e '.[test]'")
    if chromium is None:
        _missing("no `chromium` on PATH: apt-get install chromium")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield launched
        launched.close()


def open_tab(browser, width: int = 1400, height: int = 1000) -> tuple[Any, Any, list[str]]:
    """A fresh context at a viewport size; its page; the script errors and failed fetches it logs."""
    context = browser.new_context(viewport={"width": width, "height": height})
    tab = context.new_page()
    tab.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    tab.on("pageerror", lambda err: errors.append(str(err)))
    tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    return context, tab, errors


@pytest.fixture
def page(browser) -> Iterator[Any]:
    context, tab, errors = open_tab(browser)
    yield tab
    context.close()
    assert errors == [], errors  # no script error, no failed fetch


def leave(page) -> None:
    """Stop the page's polling while its server still runs (the fixture counts its errors)."""
    page.goto("about:blank")


def on_all(page, selector: str, function: str) -> Any:
    """`function` applied, in the page, to the elements matching `selector`, in one script run.
    (Playwright's eval_on_selector_all finds the elements and runs the function in two round
    trips: a refresh between them hands the function detached elements, whose computed style
    is empty and which have no boxes.)"""
    return page.evaluate(f"selector => ({function})([...document.querySelectorAll(selector)])", selector)


def figures(page, scope: str) -> dict[str, tuple[str, str]]:
    """Every figure under `scope`: data-field -> (data-value, the text shown)."""
    return on_all(
        page,
        f"{scope} [data-field]", "els => Object.fromEntries(els.map(e => [e.dataset.field, [e.dataset.value, e.textContent]]))"
    )


def boxes(page, selector: str) -> list[dict[str, float]]:
    """The border boxes (x, y, width, height, right, bottom) of the visible elements matching."""
    return on_all(
        page,
        selector,
        """els => els.filter(e => e.getClientRects().length).map(e => {
             const r = e.getBoundingClientRect();
             return {x: r.x, y: r.y + scrollY, width: r.width, height: r.height, right: r.right, bottom: r.bottom + scrollY};
           })""",
    )


def overlap(a: dict[str, float], b: dict[str, float]) -> float:
    """The area two boxes share."""
    w = min(a["right"], b["right"]) - max(a["x"], b["x"])
    h = min(a["bottom"], b["bottom"]) - max(a["y"], b["y"])
    return max(w, 0) * max(h, 0)


def overflowing(page, selector: str) -> list[str]:
    """Elements matching `selector` whose content is wider than they are (cut or spilling),
    by tag, class and text."""
    return on_all(
        page,
        selector,
        """els => els.filter(e => e.getClientRects().length && e.scrollWidth > e.clientWidth + 1)
                     .map(e => `${e.tagName.toLowerCase()}.${e.className}: ${e.textContent.slice(0, 60)}`)""",
    )
