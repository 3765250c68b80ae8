"""pandera schemas for parsed products and per-page summaries, and lazy validation of both.

Frames and dtypes (pandas 3, the line the project pins: ``str`` is
``pd.StringDtype(na_value=nan)``):

* products, built by :func:`products_frame`: one row per product seen on a listing page,
  columns :data:`PRODUCT_COLUMNS` in that order. Text columns ``str``; ``price`` ``object``
  holding ``decimal.Decimal`` (exact, never float); ``rating`` and ``page_number`` ``int64``.
* pages, built by :func:`pages_frame`: one row per fetched listing page, columns
  :data:`PAGE_COLUMNS`: ``products_parsed``
  and ``cards_found`` ``int64``, ``site_claims_products`` and ``listing_recognised`` ``bool``.

:func:`validate_parsed` validates both with ``lazy=True`` and returns a JSON-serialisable
:class:`ValidationReport` holding every failure case; it never raises for data problems.
"""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np
import pandas as pd
import pandera.pandas as pa
from pandera.engines import pandas_engine
from pandera.typing import Series

from scrape_assets.limits import MAX_PRODUCT_ID_CHARS, as_written, price_fits
from scrape_assets.spec import DEFAULT_MAX_REJECTED_SHARE, PARTITION_KEY_PATTERN
from scrape_assets.validation_report import (  # noqa: F401 - re-exported
    MAX_FAILURE_CASES,
    ValidationReport,
    check_key,
    merge_reports,
)

PRODUCT_COLUMNS: tuple[str, ...] = (
    "category",
    "product_id",
    "title",
    "price",
    "currency",
    "rating",
    "availability",
    "url",
    "page_number",
    "snapshot_id",
    "fetched_at",
)
PAGE_COLUMNS: tuple[str, ...] = ("category", "page_number", "products_parsed", "cards_found", "site_claims_products",
                                 "listing_recognised")
_BOOL_PAGE_COLUMNS = ("site_claims_products", "listing_recognised")

_STR_COLUMNS = ("category", "product_id", "title", "currency", "availability", "url", "snapshot_id", "fetched_at")
_INT_COLUMNS = ("rating", "page_number")
#: UTC timestamps as written by ``datetime.now(timezone.utc).isoformat()`` (or with ``Z``).
FETCHED_AT_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|\+00:00)$"
LAYOUT_GUARD_MESSAGE = (
    "page parsed to zero products while the site says it has some: no card matched selectors.product, or all "
    "were rejected; the layout may have changed"
)
UNRECOGNISED_PAGE_CHECK = "unrecognised_page"
UNRECOGNISED_PAGE_MESSAGE = (
    "page has no product card and none of the listing's elements (pager, next link, the spec's "
    "pagination.results_count, which even an empty listing shows): not a listing page (a bot check or an "
    "error page served with status 200, or a redesign); the category's earlier rows are kept"
)
#: A partition fails when more than this share of its product cards were rejected (a field
#: unreadable) and more than :data:`REJECTS_ALWAYS_ALLOWED` of them: a selector that stopped
#: matching some cards (a redesign, an A/B test) must not silently drop those products.
#: The share is the spec's ``validation.max_rejected_share`` (passed to :func:`pages_frame`).
REJECTS_ALWAYS_ALLOWED = 2
REJECTED_SHARE_CHECK = "rejected_share"
REJECTED_SHARE_MESSAGE = (
    "more of the partition's product cards were rejected than the spec's validation.max_rejected_share "
    f"allows (default {DEFAULT_MAX_REJECTED_SHARE:.0%}; a field's selector may no longer match some cards): each case "
    "is a page with rejected cards, `reject_reasons` the category's most common reasons"
)


@pandas_engine.Engine.register_dtype
class Text(pandas_engine.STRING):
    """pandera's string dtype (what ``Series[str]`` means), answering its dtype check with one bool.

    pandera 0.35's ``STRING.check`` answers a column that already has pandas' string dtype
    with an all-True array, and its dtype check then formats a message holding the (empty)
    frame of failing values for every such column of every validation: ~1.7 ms a column,
    a quarter of validating a 2,000-row partition. When every value passes, this answers
    ``True`` instead; otherwise pandera's own answer, so failure cases and their names are
    those of ``Series[str]`` (``dtype('string[python]')``, or ``string[pyarrow]`` where
    pyarrow is installed). A schema written with ``to_yaml`` names it as pandera's string
    dtype: read back, it compares unequal. (On pandas 2, whose ``str`` columns are
    ``object``, pandas' string dtype would refuse an empty column: the project pins pandas 3.)
    """

    def check(self, pandera_dtype, data_container=None):  # noqa: ANN001, ANN201 - pandera's signature
        result = super().check(pandera_dtype, data_container)
        if isinstance(result, np.ndarray) and result.all():
            return True
        return result


def _is_positive_decimal(value: object) -> bool:
    return isinstance(value, Decimal) and value.is_finite() and value > 0


class ProductsSchema(pa.DataFrameModel):
    """One row per product seen on one listing page of one category in one snapshot."""

    category: Series[Text] = pa.Field(
        str_matches=PARTITION_KEY_PATTERN, description="partition key of the category (spec `categories` key)"
    )
    product_id: Series[Text] = pa.Field(str_length={"min_value": 1, "max_value": MAX_PRODUCT_ID_CHARS},
                                        description="site's id, from the product URL")
    title: Series[Text] = pa.Field(str_length={"min_value": 1}, description="full title, mojibake repaired")
    price: Series[object] = pa.Field(description="decimal.Decimal > 0, in units of `currency` (e.g. pounds), whole "
                                                 "cents below 10**10 (the warehouse's NUMERIC(12, 2))")
    currency: Series[Text] = pa.Field(str_matches=r"^[A-Z]{3}$", description="ISO 4217 code of `price`")
    rating: Series[int] = pa.Field(in_range={"min_value": 1, "max_value": 5}, description="stars, 1..5")
    availability: Series[Text] = pa.Field(str_length={"min_value": 1}, description='as shown, e.g. "In stock"')
    url: Series[Text] = pa.Field(str_matches=r"^https?://", description="absolute product URL on the canonical site")
    page_number: Series[int] = pa.Field(ge=1, description="1-based listing page the product was seen on")
    snapshot_id: Series[Text] = pa.Field(str_length={"min_value": 1}, description="snapshot the page belongs to")
    fetched_at: Series[Text] = pa.Field(
        str_matches=FETCHED_AT_PATTERN, description="when the page was fetched, UTC ISO 8601 string"
    )

    class Config:
        strict = True
        ordered = True
        unique = ["category", "product_id"]

    @pa.check("price", name="is_positive_decimal")
    def _price_is_positive_decimal(cls, price: Series[object]) -> Series[bool]:
        return price.map(_is_positive_decimal).astype(bool)

    @pa.check("price", name="fits_warehouse_numeric_12_2")
    def _price_fits_the_warehouse(cls, price: Series[object]) -> Series[bool]:
        return price.map(lambda value: not isinstance(value, Decimal) or price_fits(value)).astype(bool)


class PagesSchema(pa.DataFrameModel):
    """One row per fetched listing page: how many product cards it had and how many parsed."""

    category: Series[Text] = pa.Field(str_matches=PARTITION_KEY_PATTERN, description="partition key of the category")
    page_number: Series[int] = pa.Field(ge=1, description="1-based listing page number")
    products_parsed: Series[int] = pa.Field(ge=0, description="products parsed from the page (one listed on an "
                                                             "earlier page too counts here; its row is the first)")
    cards_found: Series[int] = pa.Field(ge=0, description="elements matching the spec's product selector")
    site_claims_products: Series[bool] = pa.Field(
        description="the site says this page lists products (pager or results count > 0)"
    )
    listing_recognised: Series[bool] = pa.Field(
        description="the page has a product card or one of the listing's elements (pager, next link, results "
                    "count), or the spec names no results count (then an empty listing cannot be told apart)"
    )

    class Config:
        strict = True
        unique = ["category", "page_number"]

    @pa.dataframe_check(name="layout_guard", error=LAYOUT_GUARD_MESSAGE)
    def _layout_guard(cls, pages: pd.DataFrame) -> Series[bool]:
        return ~pages["site_claims_products"].astype(bool) | (pages["products_parsed"] > 0)

    @pa.dataframe_check(name=UNRECOGNISED_PAGE_CHECK, error=UNRECOGNISED_PAGE_MESSAGE)
    def _listing_recognised(cls, pages: pd.DataFrame) -> Series[bool]:
        return pages["listing_recognised"].astype(bool)

    @pa.dataframe_check(name="parsed_at_most_cards", error="more products parsed than product cards found")
    def _parsed_at_most_cards(cls, pages: pd.DataFrame) -> Series[bool]:
        return pages["products_parsed"] <= pages["cards_found"]

    @pa.dataframe_check(name=REJECTED_SHARE_CHECK, error=REJECTED_SHARE_MESSAGE)
    def _few_cards_rejected(cls, pages: pd.DataFrame) -> Series[bool]:
        """Partition-wide; the pages with rejected cards are the failure cases."""
        rejected_by_page = pages["cards_found"] - pages["products_parsed"]
        rejected, cards = int(rejected_by_page.sum()), int(pages["cards_found"].sum())
        share = pages.attrs.get("max_rejected_share", DEFAULT_MAX_REJECTED_SHARE)
        # 29 of 100 cards rejected under a share of 0.29 is not more than the share.
        too_many = rejected > max(REJECTS_ALWAYS_ALLOWED, as_written(share) * cards)
        return ~(rejected_by_page > 0) if too_many else pd.Series(True, index=pages.index)


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _check_keys(kind: str, rows: list[dict], columns: tuple[str, ...]) -> None:
    expected = set(columns)
    for index, row in enumerate(rows):
        if row.keys() != expected:
            missing, unknown = sorted(expected - row.keys()), sorted(row.keys() - expected)
            raise ValueError(f"{kind} row {index}: missing keys {missing}, unknown keys {unknown}")


def products_frame(rows: list[dict]) -> pd.DataFrame:
    """Build the products frame from parsed rows completed with the partition's columns.

    Args:
        rows: one dict per product with every key of :data:`PRODUCT_COLUMNS` (the parser's
            keys plus ``category``, ``page_number``, ``snapshot_id``, ``fetched_at``).

    Returns:
        A frame with exactly :data:`PRODUCT_COLUMNS` in order and a ``RangeIndex``: text
        columns ``str``, ``price`` ``object`` (Decimal), ``rating``/``page_number`` ``int64``.
        Bad values are kept for :func:`validate_parsed` to report: ``None`` becomes a null,
        and an integer column holding a non-integer stays ``object``. ``[]`` gives an empty
        frame with those columns and dtypes.

    Raises:
        ValueError: a row lacks a key or has an unknown one (a programming error, not data);
            the message names the row index and the keys.
    """
    _check_keys("product", rows, PRODUCT_COLUMNS)
    columns: dict[str, pd.Series] = {}
    for name in PRODUCT_COLUMNS:
        values = [row[name] for row in rows]
        if name in _STR_COLUMNS:
            columns[name] = pd.Series(values, dtype="str")
        elif name in _INT_COLUMNS and all(_is_int(v) for v in values):
            columns[name] = pd.Series(values, dtype="int64")
        else:
            columns[name] = pd.Series(values, dtype=object)
    return pd.DataFrame(columns, columns=list(PRODUCT_COLUMNS))


def pages_frame(rows: list[dict], *, max_rejected_share: float = DEFAULT_MAX_REJECTED_SHARE) -> pd.DataFrame:
    """Build the per-page summary frame.

    Args:
        rows: one dict per listing page with exactly the keys of :data:`PAGE_COLUMNS`.
        max_rejected_share: the partition's allowed share of rejected cards (0..1), kept in
            the frame's ``attrs`` for the schema's ``rejected_share`` check.

    Returns:
        A frame with :data:`PAGE_COLUMNS` in order: ``category`` ``str``, the counts
        ``int64``, ``site_claims_products`` and ``listing_recognised`` ``bool`` (a column holding other values stays
        ``object`` for :func:`validate_parsed` to report).

    Raises:
        ValueError: a row lacks a key or has an unknown one; the message names the row index.
    """
    _check_keys("page", rows, PAGE_COLUMNS)
    columns: dict[str, pd.Series] = {}
    for name in PAGE_COLUMNS:
        values = [row[name] for row in rows]
        if name == "category":
            columns[name] = pd.Series(values, dtype="str")
        elif name in _BOOL_PAGE_COLUMNS and all(isinstance(v, (bool, np.bool_)) for v in values):
            columns[name] = pd.Series(values, dtype="bool")
        elif name not in _BOOL_PAGE_COLUMNS and all(_is_int(v) for v in values):
            columns[name] = pd.Series(values, dtype="int64")
        else:
            columns[name] = pd.Series(values, dtype=object)
    frame = pd.DataFrame(columns, columns=list(PAGE_COLUMNS))
    frame.attrs["max_rejected_share"] = max_rejected_share
    return frame


def _jsonable(value: object) -> object:
    """A failure-case value as str/int/float/bool/None (Decimal -> str, numpy scalars -> Python)."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, Decimal):
        return None if value.is_nan() else str(value)
    if value is pd.NA or value is pd.NaT:
        return None
    return str(value)


def _cases(schema_name: str, schema: type[pa.DataFrameModel], failure_cases: pd.DataFrame) -> list[dict]:
    """Turn pandera's long failure-case frame into dicts; one dict per row for row-wise frame checks.

    pandera names a check that has an ``error`` by that message; name it by its ``name`` and
    keep the message under ``"message"``.
    """
    messages = {check.error: check.name for check in schema.to_schema().checks if check.error}
    cases: list[dict] = []
    row_checks: dict[tuple[str, object], dict] = {}
    for record in failure_cases.to_dict("records"):
        index = _jsonable(record["index"])
        column = _jsonable(record["column"])
        value = _jsonable(record["failure_case"])
        check = str(record["check"])
        if record["schema_context"] == "DataFrameSchema" and index is not None and column is not None:
            key = (check, index)
            if key not in row_checks:
                row_checks[key] = {
                    "schema": schema_name,
                    "schema_context": "DataFrameSchema",
                    "column": [],
                    "check": messages.get(check, check),
                    "failure_case": {},
                    "index": index,
                }
                if check in messages:
                    row_checks[key]["message"] = check
                cases.append(row_checks[key])
            row_checks[key]["column"].append(column)
            row_checks[key]["failure_case"][column] = value
            continue
        cases.append(
            {
                "schema": schema_name,
                "schema_context": str(record["schema_context"]),
                "column": column,
                "check": check,
                "failure_case": value,
                "index": index,
            }
        )
    for case in row_checks.values():
        case["column"] = ",".join(case["column"])
    return cases


def validate_parsed(products: pd.DataFrame, pages: pd.DataFrame) -> ValidationReport:
    """Validate the products and pages frames lazily and report every failure case at once.

    Args:
        products: frame shaped like :func:`products_frame`'s output.
        pages: frame with :data:`PAGE_COLUMNS` (one row per listing page).

    Returns:
        A :class:`ValidationReport`; ``passed`` is False when either frame has a failure
        case (a wrong dtype, a missing or extra column, a null, a failed check, a duplicate
        key, or a page that tripped the layout guard).
    """
    cases: list[dict] = []
    for schema_name, schema, frame in (("products", ProductsSchema, products), ("pages", PagesSchema, pages)):
        try:
            schema.validate(frame, lazy=True)
        except pa.errors.SchemaErrors as exc:
            cases.extend(_cases(schema_name, schema, exc.failure_cases))
    by_check: dict[str, int] = {}
    for case in cases:
        key = check_key(case)
        by_check[key] = by_check.get(key, 0) + 1
    return ValidationReport(
        passed=not cases, failure_count=len(cases), failure_cases=cases[:MAX_FAILURE_CASES], by_check=by_check
    )
