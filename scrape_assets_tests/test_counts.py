"""counted(): the count and its noun agree in progress and summary lines."""

import pytest

from scrape_assets.counts import counted


@pytest.mark.parametrize(
    ("n", "noun", "plural", "expected"),
    [
        (1, "page", None, "1 page"),
        (0, "page", None, "0 pages"),
        (2, "page", None, "2 pages"),
        (1234, "page", None, "1,234 pages"),
        (1, "category", None, "1 category"),
        (12, "category", None, "12 categories"),
        (3, "day", None, "3 days"),
        (2, "worker process", None, "2 worker processes"),
        (1, "worker process", None, "1 worker process"),
        (2, "rejected card", None, "2 rejected cards"),
        (2, "earlier row", "earlier rows", "2 earlier rows"),
        (-1, "page", None, "-1 page"),
        (2, "match", None, "2 matches"),
        (3, "crash", None, "3 crashes"),
        (2, "box", None, "2 boxes"),
    ],
)
def test_counted(n, noun, plural, expected):
    assert counted(n, noun, plural) == expected
