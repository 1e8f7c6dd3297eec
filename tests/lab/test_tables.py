"""The one table printer, in text and Markdown."""

from gradsift.lab.tables import Column, render

ROWS = [{"n": 10, "ms": 1.2345, "tag": None}, {"n": 2000, "ms": 10.0, "tag": "x"}]
COLUMNS = [Column("n", "N", "d"), Column("ms", "time ms", ".2f"), Column("tag", "tag")]


def test_text_table_is_aligned():
    assert render(ROWS, COLUMNS).splitlines() == [
        "   N  time ms  tag",
        "----  -------  ---",
        "  10     1.23     ",
        "2000    10.00    x",
    ]


def test_markdown_table_and_computed_columns():
    md = render(
        [[1, 2]], [Column(0, "a"), Column(lambda r: r[0] + r[1], "sum", "d")], markdown=True
    )
    assert md == "| a | sum |\n|---|---|\n| 1 | 3 |\n"
