"""The suite's property tests draw the same examples on every run (``conftest.py``)."""

from hypothesis import given, strategies as st


def test_a_property_test_draws_the_same_examples_on_every_run():
    def drawn() -> list:
        seen = []

        @given(st.integers(), st.floats(allow_nan=False))
        def record(i, x):
            seen.append((i, x))

        record()
        return seen

    first = drawn()
    assert len(first) > 10 and first == drawn()
