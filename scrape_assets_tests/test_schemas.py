"""Tests for scrape_assets.schemas: frame builders, each check, the layout guard, the report."""

from __future__ import annotations

import json
from decimal import Decimal

import pandas as pd
import pytest

from scrape_assets.schemas import (
    LAYOUT_GUARD_MESSAGE,
    PAGE_COLUMNS,
    PRODUCT_COLUMNS,
    REJECTED_SHARE_MESSAGE,
    UNRECOGNISED_PAGE_MESSAGE,
    pages_frame,
    products_frame,
    validate_parsed,
)


def _row(**overrides) -> dict:
    row = {
        "category": "mystery",
        "product_id": "997",
        "title": "Sharp Objects",
        "price": Decimal("47.82"),
        "currency": "GBP",
        "rating": 4,
        "availability": "In stock",
        "url": "https://books.toscrape.com/catalogue/sharp-objects_997/index.html",
        "page_number": 1,
        "snapshot_id": "20240101T000000Z",
        "fetched_at": "2024-01-01T00:00:00.123456+00:00",
    }
    return {**row, **overrides}


def _rows() -> list[dict]:
    return [
        _row(),
        _row(product_id="996", title="Tipping", price=Decimal("53.74"), rating=1, fetched_at="2024-01-01T00:00:01Z"),
        _row(category="travel", page_number=2),  # same product id in another category is fine
    ]


def _pages(**overrides) -> pd.DataFrame:
    return pages_frame([_page_row(**overrides)])


def _page_row(category="mystery", page_number=1, products_parsed=2, cards_found=2, site_claims_products=True,
              listing_recognised=True) -> dict:
    return {
        "category": category,
        "page_number": page_number,
        "products_parsed": products_parsed,
        "cards_found": cards_found,
        "site_claims_products": site_claims_products,
        "listing_recognised": listing_recognised,
    }


def test_products_frame_columns_and_dtypes():
    frame = products_frame(_rows())
    assert tuple(frame.columns) == PRODUCT_COLUMNS
    assert str(frame["title"].dtype) == "str"  # pandas 3: StringDtype(na_value=nan)
    assert frame["price"].dtype == object
    assert frame["price"].tolist() == [Decimal("47.82"), Decimal("53.74"), Decimal("47.82")]
    assert frame["rating"].dtype == "int64" and frame["page_number"].dtype == "int64"
    assert frame["product_id"].tolist() == ["997", "996", "997"]


def test_products_frame_empty_keeps_columns_and_validates():
    frame = products_frame([])
    assert tuple(frame.columns) == PRODUCT_COLUMNS and len(frame) == 0
    assert frame["rating"].dtype == "int64" and frame["price"].dtype == object
    report = validate_parsed(frame, pages_frame([]))
    assert (report.passed, report.failure_count, report.failure_cases, report.by_check) == (True, 0, [], {})


def test_products_frame_rejects_rows_with_wrong_keys():
    row = _row()
    del row["category"]
    with pytest.raises(ValueError, match=r"product row 1: missing keys \['category'\], unknown keys \['colour'\]"):
        products_frame([_row(), {**row, "colour": "red"}])


def test_pages_frame_columns_and_dtypes():
    frame = _pages()
    assert tuple(frame.columns) == PAGE_COLUMNS
    assert frame.dtypes.astype(str).tolist() == ["str", "int64", "int64", "int64", "bool", "bool"]


def test_valid_frames_pass():
    report = validate_parsed(products_frame(_rows()), _pages())
    assert report.passed is True
    assert report.failure_count == 0 and report.failure_cases == [] and report.by_check == {}


def _only_failure(products: list[dict], pages: pd.DataFrame | None = None) -> dict:
    report = validate_parsed(products_frame(products), _pages() if pages is None else pages)
    assert report.passed is False
    assert report.failure_count == 1, report.failure_cases
    (case,) = report.failure_cases
    json.dumps(case)  # JSON-serialisable, as Dagster metadata needs
    return case


def test_price_zero_fails():
    case = _only_failure([_row(price=Decimal("0"))])
    assert (case["schema"], case["column"], case["check"], case["failure_case"], case["index"]) == (
        "products",
        "price",
        "is_positive_decimal",
        "0",
        0,
    )


def test_price_float_instead_of_decimal_fails():
    case = _only_failure([_row(), _row(product_id="1", price=47.82)])
    assert (case["column"], case["check"], case["index"]) == ("price", "is_positive_decimal", 1)
    assert case["failure_case"] == 47.82


def test_rating_six_fails():
    case = _only_failure([_row(rating=6)])
    assert (case["column"], case["check"], case["failure_case"], case["index"]) == ("rating", "in_range(1, 5)", 6, 0)


def test_duplicate_key_fails_on_both_rows():
    report = validate_parsed(products_frame([_row(), _row(title="Again"), _row(product_id="1")]), _pages())
    assert report.failure_count == 2
    assert report.by_check == {"products: multiple_fields_uniqueness": 2}
    assert [(c["column"], c["check"], c["failure_case"], c["index"]) for c in report.failure_cases] == [
        ("category,product_id", "multiple_fields_uniqueness", {"category": "mystery", "product_id": "997"}, 0),
        ("category,product_id", "multiple_fields_uniqueness", {"category": "mystery", "product_id": "997"}, 1),
    ]


def test_null_title_fails():
    case = _only_failure([_row(), _row(product_id="1", title=None)])
    assert (case["column"], case["check"], case["failure_case"], case["index"]) == ("title", "not_nullable", None, 1)


@pytest.mark.parametrize("currency", ["gbp", "£", "GBPX"])
def test_bad_currency_fails(currency):
    case = _only_failure([_row(currency=currency)])
    assert (case["column"], case["check"], case["failure_case"]) == ("currency", "str_matches('^[A-Z]{3}$')", currency)


@pytest.mark.parametrize(
    ("overrides", "column", "check"),
    [
        ({"url": "/catalogue/x_1/index.html"}, "url", "str_matches('^https?://')"),
        ({"page_number": 0}, "page_number", "greater_than_or_equal_to(1)"),
        ({"fetched_at": "2024-01-01 00:00:00"}, "fetched_at", "str_matches"),
        ({"fetched_at": "2024-01-01T00:00:00+02:00"}, "fetched_at", "str_matches"),
        ({"category": "Mystery Books"}, "category", "str_matches"),
        ({"title": ""}, "title", "str_length(1, None)"),
        ({"product_id": "9" * 65}, "product_id", "str_length(1, 64)"),
        ({"price": Decimal("1.999")}, "price", "fits_warehouse_numeric_12_2"),  # PostgreSQL would round it,
        ({"price": Decimal("1E10")}, "price", "fits_warehouse_numeric_12_2"),  # or refuse the partition
    ],
)
def test_other_column_checks(overrides, column, check):
    case = _only_failure([_row(**overrides)])
    assert case["column"] == column and case["check"].startswith(check)
    assert case["failure_case"] == next(iter(overrides.values())) or str(case["failure_case"]) == str(
        next(iter(overrides.values())))  # (Decimals are reported as their text)


def test_all_failures_reported_at_once():
    products = products_frame([_row(price=Decimal("0"), rating=6, currency="gbp"), _row(title=None)])
    report = validate_parsed(products, _pages(products_parsed=0, cards_found=0))
    assert report.failure_count == 7
    assert report.by_check == {
        "products: multiple_fields_uniqueness": 2,
        "products.title: not_nullable": 1,
        "products.price: is_positive_decimal": 1,
        "products.currency: str_matches('^[A-Z]{3}$')": 1,
        "products.rating: in_range(1, 5)": 1,
        "pages: layout_guard": 1,
    }
    json.dumps(report.failure_cases)


def test_layout_guard_fails_page_with_zero_products_the_site_claims():
    pages = pages_frame(
        [
            _page_row(page_number=1, products_parsed=20, cards_found=20),
            _page_row(page_number=2, products_parsed=0, cards_found=0),
            _page_row(category="empty", products_parsed=0, cards_found=0, site_claims_products=False),
        ]
    )
    case = _only_failure([_row()], pages)
    assert case["schema"] == "pages" and case["check"] == "layout_guard" and case["index"] == 1
    assert case["message"] == LAYOUT_GUARD_MESSAGE
    assert "the layout may have changed" in case["message"]
    assert case["failure_case"] == {
        "category": "mystery",
        "page_number": 2,
        "products_parsed": 0,
        "cards_found": 0,
        "site_claims_products": True,
        "listing_recognised": True,
    }


def test_a_page_that_is_no_listing_fails_its_partition():
    """A bot check served as 200 (no card, no pager, no results count) must not empty the category."""
    pages = pages_frame(
        [
            _page_row(page_number=1, products_parsed=0, cards_found=0, site_claims_products=False,
                      listing_recognised=False),
            _page_row(category="empty", products_parsed=0, cards_found=0, site_claims_products=False),
        ]
    )
    report = validate_parsed(products_frame([]), pages)
    assert not report.passed and report.by_check == {"pages: unrecognised_page": 1}
    case = report.failure_cases[0]
    assert case["index"] == 0 and case["message"] == UNRECOGNISED_PAGE_MESSAGE
    assert case["failure_case"]["category"] == "mystery" and case["failure_case"]["listing_recognised"] is False


@pytest.mark.parametrize(
    ("rejected", "cards", "passes"),
    [(5, 100, True), (6, 100, False), (2, 10, True), (3, 10, False), (0, 40, True)],
)
def test_a_partition_with_many_rejected_cards_fails(rejected, cards, passes):
    """More than 5% (and more than 2) of a partition's cards rejected: some selector stopped matching."""
    half = cards // 2  # two pages; the rejects on the second
    pages = pages_frame([_page_row(page_number=1, products_parsed=half, cards_found=half),
                         _page_row(page_number=2, products_parsed=cards - half - rejected, cards_found=cards - half)])
    report = validate_parsed(products_frame([_row()]), pages)
    assert report.passed is passes
    if not passes:
        [case] = report.failure_cases
        assert (case["schema"], case["check"], case["index"]) == ("pages", "rejected_share", 1)
        assert case["message"] == REJECTED_SHARE_MESSAGE and "validation.max_rejected_share" in case["message"]
        assert case["failure_case"]["page_number"] == 2
        assert case["failure_case"]["cards_found"] - case["failure_case"]["products_parsed"] == rejected


def test_the_allowed_share_of_rejected_cards_comes_from_the_spec():
    pages = [_page_row(page_number=1, products_parsed=40, cards_found=50)]  # 20% rejected
    assert not validate_parsed(products_frame([_row()]), pages_frame(pages)).passed
    assert validate_parsed(products_frame([_row()]), pages_frame(pages, max_rejected_share=0.2)).passed
    assert not validate_parsed(products_frame([_row()]), pages_frame(pages, max_rejected_share=0.19)).passed


def test_pages_parsed_more_than_cards_fails():
    case = _only_failure([_row()], _pages(products_parsed=3, cards_found=2))
    assert (case["check"], case["message"]) == ("parsed_at_most_cards", "more products parsed than product cards found")


def test_wrong_dtypes_and_missing_columns_are_reported_not_raised():
    products = products_frame([_row()]).drop(columns=["url"])
    pages = _pages().astype({"page_number": "float64"})
    report = validate_parsed(products, pages)
    assert report.passed is False
    assert report.by_check == {
        "products: column_in_dataframe": 1,
        "pages.page_number: dtype('int64')": 1,
    }
    missing = next(c for c in report.failure_cases if c["check"] == "column_in_dataframe")
    assert missing["failure_case"] == "url"


def test_report_keeps_at_most_100_cases_but_counts_all():
    rows = [_row(product_id=str(n), rating=6) for n in range(150)]
    report = validate_parsed(products_frame(rows), _pages())
    assert report.failure_count == 150
    assert len(report.failure_cases) == 100
    assert report.by_check == {"products.rating: in_range(1, 5)": 150}



def test_merged_reports_of_several_partitions_keep_at_most_100_cases_but_count_all():
    """The check's report over a run's categories: the same cap as one partition's (check metadata stays small)."""
    from scrape_assets.validation_report import MAX_FAILURE_CASES, merge_reports

    reports = [validate_parsed(products_frame([_row(product_id=f"{c}{n}", rating=6) for n in range(60)]), _pages())
               for c in "ab"]
    assert [len(r.failure_cases) for r in reports] == [60, 60]
    merged = merge_reports([*reports, validate_parsed(products_frame([_row()]), _pages())])
    assert (merged.passed, merged.failure_count, len(merged.failure_cases)) == (False, 120, MAX_FAILURE_CASES)
    assert merged.failure_cases == reports[0].failure_cases + reports[1].failure_cases[:40]  # the first ones kept
    assert merged.by_check == {"products.rating: in_range(1, 5)": 120}

def test_text_columns_pass_the_dtype_check_with_one_bool_and_fail_it_value_by_value():
    """``Text``: no per-value answer (and no failure-case frame) for a column that passes."""
    from pandera.engines import pandas_engine

    from scrape_assets.schemas import ProductsSchema, Text

    text = Text()
    passing = products_frame(_rows())["title"]
    assert text.check(pandas_engine.Engine.dtype(passing.dtype), passing) is True
    assert text.check(pandas_engine.Engine.dtype(passing.dtype)) is True
    numbers = pd.Series([1, 2], dtype="int64")
    assert text.check(pandas_engine.Engine.dtype(numbers.dtype), numbers) is False
    # through a whole validation: a text column of another dtype is reported as before
    products = products_frame(_rows())
    products["title"] = pd.Series([1, 2, 3], dtype="int64")
    report = validate_parsed(products, _pages())
    assert report.by_check[f"products.title: dtype('{ProductsSchema.to_schema().columns['title'].dtype}')"] == 1
    assert validate_parsed(products_frame(_rows()), _pages()).passed is True


@pytest.mark.parametrize("share, rejected, passes", [(0.29, 29, True), (0.29, 30, False), (0.57, 57, True),
                                                     (0.57, 58, False), (0.07, 7, True), (0.07, 8, False)])
def test_a_rejected_share_exactly_at_the_limit_passes(share, rejected, passes):
    """"More than" the share, counted exactly: 0.29 * 100 cards is 29, not 28.999999999999996."""
    pages = [_page_row(page_number=1, products_parsed=100 - rejected, cards_found=100)]
    assert validate_parsed(products_frame([_row()]), pages_frame(pages, max_rejected_share=share)).passed is passes



# Boundaries a mutation audit found unpinned (each test fails on its mutation).
def test_a_page_listed_twice_fails_the_pages_schema():
    from scrape_assets.schemas import pages_frame, products_frame, validate_parsed

    row = {"category": "travel", "page_number": 1, "products_parsed": 3, "cards_found": 3,
           "site_claims_products": True, "listing_recognised": True}
    report = validate_parsed(products_frame([]), pages_frame([row, dict(row)]))
    assert not report.passed
    assert any("unique" in key for key in report.by_check), report.by_check


def test_an_apostrophe_inside_a_word_opens_no_quoted_value():
    from scrape_assets.validation_report import reason_kind

    assert (reason_kind("price: '1,234.56' does not fit the spec's decimal_mark ','")
            == "price: … does not fit the spec's decimal_mark …")


def test_exactly_as_many_pages_as_shown_are_listed_without_an_ellipsis():
    from scrape_assets.validation_report import ValidationReport, describe_failures

    cases = [{"schema": "pages", "schema_context": "DataFrameSchema", "column": "page_number",
              "check": "layout_guard", "failure_case": {"page_number": n}, "index": n - 1, "message": "layout"}
             for n in (1, 2, 3)]
    text = describe_failures(ValidationReport(passed=False, failure_count=3, failure_cases=cases,
                                              by_check={"pages: layout_guard": 3}))
    assert text == "pages: layout_guard x3 (pages 1, 2, 3; layout)"


def test_more_pages_than_shown_are_cut_to_the_limit_with_an_ellipsis():
    """A layout change fails every page of a category: the alert line names the first few, not 50."""
    from scrape_assets.validation_report import ValidationReport, describe_failures

    cases = [{"schema": "pages", "schema_context": "DataFrameSchema", "column": "page_number",
              "check": "layout_guard", "failure_case": {"page_number": n}, "index": n - 1, "message": "layout"}
             for n in range(1, 51)]
    text = describe_failures(ValidationReport(passed=False, failure_count=50, failure_cases=cases,
                                              by_check={"pages: layout_guard": 50}))
    assert text == "pages: layout_guard x50 (pages 1, 2, 3, ...; layout)"


@pytest.mark.parametrize(("price", "fits"), [
    ("9999999999.99", True), ("10000000000", False), ("0.01", True), ("51.770", True), ("0", True),
    ("1.999", False), ("NaN", False), ("Infinity", False), ("-Infinity", False),
])
def test_the_largest_price_numeric_12_2_holds_fits_and_no_more(price, fits):
    from scrape_assets.limits import price_fits

    assert price_fits(Decimal(price)) is fits
