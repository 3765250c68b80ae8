"""What the warehouse's columns hold, shared by the parser, the schema and the tables.

``products.product_id`` (and ``price_history``'s) is ``VARCHAR(64)``; ``price`` is
``NUMERIC(12, 2)``: at most 10 digits before the decimal mark and 2 after. The parser
rejects a card beyond them (a parse dead letter naming the limit) and the pandera schema
checks them again, so every database loads the same rows: SQLite ignores the declared
sizes and would store such a row, PostgreSQL would refuse the whole partition's load
(``value too long``, ``numeric field overflow``), and both would round a third decimal away
when reading the price back. A site with 3-decimal prices (KWD, BHD...) or longer ids
needs wider columns (and, on an existing PostgreSQL warehouse, an ``ALTER TABLE``).

Also :func:`as_written`, how the limits of shares and rates (``max_rejected_share``, the
collapse sensor's ``max_drop``) are compared: as the decimals they are written as.
"""

from __future__ import annotations

from decimal import Decimal

#: Longest ``product_id`` the warehouse keeps (characters).
MAX_PRODUCT_ID_CHARS = 64
#: ``NUMERIC(PRICE_PRECISION, PRICE_SCALE)``: total digits, and digits after the decimal mark.
PRICE_PRECISION, PRICE_SCALE = 12, 2
_CENT = Decimal(1).scaleb(-PRICE_SCALE)


def price_fits(price: Decimal) -> bool:
    """Whether ``price`` (finite) is stored exactly by ``NUMERIC(12, 2)``: below 10**10, whole cents.

    ``Decimal("51.770")`` fits (it is 51.77); ``Decimal("1.999")`` and ``Decimal("1E10")`` do not.
    """
    if not price.is_finite():
        return False
    if price and price.adjusted() >= PRICE_PRECISION - PRICE_SCALE:
        return False
    return price == price.quantize(_CENT)


def as_written(value: float) -> Decimal:
    """The decimal ``value`` is written as (its shortest repr), for comparing a share or a
    rate with its limit exactly: ``0.29 * 100`` is 28.999999999999996 and ``0.9 - 0.6`` is
    0.30000000000000004 in binary floating point; ``as_written(0.29) * 100`` is 29.00."""
    return Decimal(repr(float(value)))
