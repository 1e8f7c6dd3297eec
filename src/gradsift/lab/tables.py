"""One table printer for the command line (aligned text) and the docs (Markdown)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Column", "columns", "percent", "render"]


def percent(fraction: float) -> str:
    """``fraction`` as a percentage with up to three significant digits (0.004 is
    ``0.4%``, 0.991 ``99.1%``: a whole-percent label would read 0% and 99%)."""
    return f"{100 * fraction:.3g}%"


@dataclass(frozen=True)
class Column:
    """A column: ``key`` into each row (a dict key, a list index, or a function of the
    row), its ``header`` and a ``format`` spec; a missing or None value is blank."""

    key: str | int | Callable[[dict], object]
    header: str
    fmt: str = ""

    def cell(self, row) -> str:
        if callable(self.key):
            value = self.key(row)
        elif isinstance(row, dict):
            value = row.get(self.key)
        else:
            value = row[self.key]
        return "" if value is None else format(value, self.fmt)


def columns(spec: str) -> list[Column]:
    """Columns from a text table, one per line: key, header, format, separated by two
    or more spaces (a header may hold single spaces; the format may be left out)."""
    out = []
    for line in spec.strip().splitlines():
        key, header, *fmt = re.split(r"\s{2,}", line.strip())
        out.append(Column(key, header, fmt[0] if fmt else ""))
    return out


def render(rows: list, columns: list[Column], *, markdown: bool = False) -> str:
    """``rows`` as a table; text is right-aligned under a dashed rule."""
    header = [c.header for c in columns]
    cells = [[c.cell(r) for c in columns] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(line) + " |" for line in cells]
        return "\n".join(lines) + "\n"
    table = [header, *cells]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    out = ["  ".join(c.rjust(w) for c, w in zip(header, widths))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells]
    return "\n".join(out)
