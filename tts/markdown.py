"""Markdown tables: the one table writer of every summary, report, replay and profile table,
and the number cell they share ("-" where there is no number)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from numbers import Number
from typing import Any


def is_number(value: Any) -> bool:
    """A number a table can print or divide: an int or a float (numpy's too), not a bool."""
    return isinstance(value, Number) and not isinstance(value, (bool, complex))


def number(value: Any, spec: str | None = None) -> str:
    """A table cell: "-" for None. With `spec` (a format string, "{:.2f}x"), a number
    written by it and "-" for anything that is not a number (`is_number`); without, a float
    to three significant digits (whole from 1000) and anything else as it prints."""
    if value is None:
        return "-"
    if spec is not None:
        return spec.format(value) if is_number(value) else "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def markdown_table(head: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table: the header, the rule, a line per row; a cell prints as it is,
    None as "-"."""
    def line(cells: Sequence[Any]) -> str:
        return "| " + " | ".join("-" if c is None else str(c) for c in cells) + " |"

    return "\n".join([line(head), "|" + "---|" * len(head), *(line(r) for r in rows)])
