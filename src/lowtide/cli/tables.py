"""Tables that stay readable in a pipe, a log file and an 80-column terminal.

Rich cuts a cell that does not fit ("1000…"). Here a figure is never cut: figure columns are
kept whole (no wrapping, no ellipsis), text columns fold onto more lines, and when even that
does not fit the width, the least useful columns are left out, named under the table (every
field is in `--json`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text

TEXT_WORD = 16  # a text column is never narrower than its longest word, up to this
TEXT_FLOOR = 5  # ... unless figures need the room: then text folds down to this


@dataclass(frozen=True, slots=True)
class Col:
    name: str
    figure: bool = False  # a number or amount: kept whole, right-aligned
    drop: int = 0  # 0: always shown; the higher, the sooner it is left out to fit the width


def fitted_table(console: Console, cols: list[Col], rows: list[list[str]], title: str | None = None) -> Table:
    """A table of `rows` (cells may carry Rich markup) that fits `console.width`."""
    width = console.width
    cells = [[Text.from_markup(r[i]) for r in rows] for i in range(len(cols))]
    least = [_least(c, cells[i]) for i, c in enumerate(cols)]
    keep = list(range(len(cols)))
    for i in sorted((i for i, c in enumerate(cols) if c.drop), key=lambda i: -cols[i].drop):
        if _frame(keep) + sum(least[k] for k in keep) <= width:
            break
        keep.remove(i)
    _narrow_text(cols, least, keep, width - _frame(keep))
    widths = _share(width - _frame(keep), [least[k] for k in keep], [_most(cols[k], cells[k]) for k in keep])
    table = Table(title=title)
    for k, w in zip(keep, widths, strict=True):
        c = cols[k]
        # Every width is set here: Rich's own squeezing would cut figures to fit.
        table.add_column(c.name, justify="right" if c.figure else "left", overflow="fold", width=w)
    for r in rows:
        table.add_row(*(r[i] for i in keep))
    left_out = [cols[i].name for i in range(len(cols)) if i not in keep]
    if left_out:
        table.caption = f"not shown at {width} columns: {', '.join(left_out)} (see --json)"
        table.caption_justify = "left"
    return table


def _frame(keep: list[int]) -> int:
    return 3 * len(keep) + 1  # the default box: a border and a space each side of every cell


def _least(col: Col, cells: list[Text]) -> int:
    """The narrowest this column may be: a figure's every word whole (an amount may wrap
    between words, never inside one); text down to its longest word, up to TEXT_WORD."""
    words = [len(w) for t in cells for w in t.plain.split()] + [len(w) for w in col.name.split()]
    longest = max(words, default=1)
    return longest if col.figure else min(longest, TEXT_WORD)


def _narrow_text(cols: list[Col], least: list[int], keep: list[int], room: int) -> None:
    """Still too wide with every droppable column gone: fold text narrower, never figures."""
    text = [k for k in keep if not cols[k].figure]
    while sum(least[k] for k in keep) > room and any(least[k] > TEXT_FLOOR for k in text):
        widest = max(text, key=lambda k: least[k])
        least[widest] -= 1
def _most(col: Col, cells: list[Text]) -> int:
    return max([t.cell_len for t in cells] + [len(col.name)])


def _share(room: int, least: list[int], most: list[int]) -> list[int]:
    """Widths from `least` towards `most`, one column at a time, while there is room."""
    widths = list(least)
    spare = room - sum(widths)
    while spare > 0:
        grow = [i for i, w in enumerate(widths) if w < most[i]]
        if not grow:
            break
        for i in grow:
            if spare == 0:
                break
            widths[i] += 1
            spare -= 1
    return widths
