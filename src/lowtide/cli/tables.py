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

TEXT_MIN = 8  # a text column is never folded narrower than this


@dataclass(frozen=True, slots=True)
class Col:
    name: str
    figure: bool = False  # a number or amount: kept whole, right-aligned
    drop: int = 0  # 0: always shown; the higher, the sooner it is left out to fit the width


def fitted_table(console: Console, cols: list[Col], rows: list[list[str]], title: str | None = None) -> Table:
    """A table of `rows` (cells may carry Rich markup) that fits `console.width`."""
    width = console.width
    widths = [_need(c, [r[i] for r in rows]) for i, c in enumerate(cols)]
    keep = list(range(len(cols)))
    for i in sorted((i for i, c in enumerate(cols) if c.drop), key=lambda i: -cols[i].drop):
        if sum(widths[k] for k in keep) + 3 * len(keep) + 1 <= width:
            break
        keep.remove(i)
    table = Table(title=title)
    for i in keep:
        c = cols[i]
        table.add_column(c.name, justify="right" if c.figure else "left", no_wrap=c.figure, overflow="fold",
                         min_width=None if c.figure else min(widths[i], TEXT_MIN))  # fmt: skip
    for r in rows:
        table.add_row(*(r[i] for i in keep))
    left_out = [cols[i].name for i in range(len(cols)) if i not in keep]
    if left_out:
        table.caption = f"not shown at {width} columns: {', '.join(left_out)} (see --json)"
        table.caption_justify = "left"
    return table


def _need(col: Col, cells: list[str]) -> int:
    """The narrowest this column can be without cutting a figure."""
    longest = max([Text.from_markup(c).cell_len for c in cells] + [len(col.name) if col.figure else 0], default=0)
    if col.figure:
        return longest
    word = max([len(w) for w in col.name.split()], default=1)
    return max(min(longest, TEXT_MIN), word)
