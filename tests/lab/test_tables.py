"""The one table printer, in text and Markdown."""

from gradsift.lab.tables import Column, percent, render

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


def test_percent_keeps_the_digits_a_whole_percent_would_drop():
    assert [percent(f) for f in (0.004, 0.01, 0.9, 0.991, 0.994, 1.0)] == [
        "0.4%", "1%", "90%", "99.1%", "99.4%", "100%",
    ]  # fmt: skip


def test_the_run_table_says_which_top_k_run_kept_error_feedback():
    """The demo's two top-k rows differ only in error feedback; dense rows say nothing."""
    from gradsift.lab.commands import RUN_COLUMNS

    row = dict(method="unpruned", sparsity=0.0, test_accuracy=0.5, seconds=1.0)
    rows = [
        {**row, "grad_density": 1.0, "error_feedback": True},  # a dense run's record
        {**row, "grad_density": 0.004, "error_feedback": True},
        {**row, "grad_density": 0.004, "error_feedback": False},
        {**row, "method": "snip", "sparsity": 0.991, "grad_density": 1.0, "error_feedback": True},
    ]
    header, _, *lines = render(rows, RUN_COLUMNS).splitlines()
    assert "error feedback" in header
    assert [line.split()[3:-2] for line in lines] == [[], ["yes"], ["no"], []]
    assert lines[3].split()[1] == "0.991"
