"""Tables for the terminal that read well at any width: at their natural width when it fits
(a wide terminal), else with long text wrapped and every number whole, else turned so that
each column becomes a row. Piped output is 80 columns wide (rich's default; COLUMNS changes it).
Cells are never cut to `kerne…`."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

FRAME = 3  # per column in rich's default box: a rule and a space either side
TEXT_MIN = 16  # narrowest a wrapped name or path column gets before the table is turned
TURN_MAX_ROWS = 6  # a table of more rows than this is printed as one block per row instead


def _len(s: str) -> int:
    from rich.cells import cell_len

    return cell_len(s)


def _longest_word(s: str) -> int:
    return max((_len(w) for w in s.split()), default=0)


def _plain(cell: str) -> str:
    from rich.text import Text

    return Text.from_markup(cell).plain


def fit_table(
    width: int,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    text: Collection[int] = (0,),
    right: Collection[int] = (),
    caption: str | None = None,
) -> Any:
    """A rich renderable of `rows` under `headers` that fits `width` columns. Columns in `text`
    (names, paths) may wrap; the others (numbers) are kept whole; `right` ones are right-aligned."""
    plain = [[_plain(c) for c in r] for r in rows]
    n = len(headers)
    natural = [max([_len(h), *(_len(r[i]) for r in plain)]) for i, h in enumerate(headers)]
    # numbers keep their width (their headers wrap between words); text takes what is left
    fixed = [max([_longest_word(h), *(_len(r[i]) for r in plain)]) for i, h in enumerate(headers)]
    least = [min(natural[i], max(_longest_word(h), TEXT_MIN)) if i in text else fixed[i]
             for i, h in enumerate(headers)]  # fmt: skip
    for compact in (False, True):  # boxed first; then without the box's rules
        frame = 2 * (n - 1) if compact else FRAME * n + 1
        if sum(natural) + frame <= width:
            return _table(headers, rows, natural, title, right, caption, compact=compact)
        spare = width - frame - sum(least)
        if spare >= 0:
            widths = list(least)
            wanted = {i: natural[i] - least[i] for i in text if natural[i] > least[i]}
            total = sum(wanted.values())
            for i, more in wanted.items():  # share the spare width by how much each wants
                widths[i] += min(more, spare * more // total) if total else 0
            return _table(headers, rows, widths, title, right, caption, fold=text, compact=compact)
    if len(rows) <= TURN_MAX_ROWS and n > 2:  # each column becomes a row
        turned = [[h, *(r[i] for r in rows)] for i, h in enumerate(headers) if i > 0]
        first = [headers[0], *(r[0] for r in rows)]
        return fit_table(width, first, turned, title=title, text=(0,), caption=caption)
    return _records(width, headers, rows, title)


def wrap_parts(width: int, parts: Sequence[str], sep: str = ", ", indent: str = "  ") -> str:
    """`parts` joined by `sep`, broken into lines only between parts (never inside a value
    such as `98.308 ms`); lines after the first are indented."""
    lines: list[str] = []
    line = ""
    for part in parts:
        joined = f"{line}{sep}{part}" if line else part
        if line and _len(_plain(joined)) > width:
            lines.append(line + sep.rstrip())
            line = indent + part
        else:
            line = joined
    return "\n".join([*lines, line])


def _table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    widths: list[int],
    title: str | None,
    right: Collection[int],
    caption: str | None,
    fold: Collection[int] = (),
    compact: bool = False,
) -> Any:
    from rich.table import Table

    t = Table(title=title, title_justify="left", caption=caption)
    if (
        compact
    ):  # columns two spaces apart (a pad and the box's blank rule), a rule under the header
        from rich import box

        t = Table(title=title, title_justify="left", caption=caption, box=box.SIMPLE_HEAD,
                  padding=(0, 1, 0, 0), pad_edge=False, show_edge=False)  # fmt: skip
    for i, h in enumerate(headers):
        t.add_column(h, width=widths[i], justify="right" if i in right else "left",
                     overflow="fold" if i in fold else "ellipsis", no_wrap=i not in fold)  # fmt: skip
    for r in rows:
        t.add_row(*r)
    return t


def _records(
    width: int, headers: Sequence[str], rows: Sequence[Sequence[str]], title: str | None
) -> Any:
    """One small two-column block per row: for tables too wide even when turned."""
    from rich.console import Group
    from rich.table import Table

    parts: list[Any] = [title] if title else []
    key = max(_len(h) for h in headers)
    for r in rows:
        t = Table(show_header=False, box=None, padding=(0, 1))
        t.add_column(width=key, no_wrap=True)
        t.add_column(width=max(8, width - key - 3), overflow="fold")
        for h, cell in zip(headers, r, strict=True):
            t.add_row(h, cell)
        parts += [t, ""]
    return Group(*parts)
