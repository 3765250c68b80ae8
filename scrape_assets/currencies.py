"""The ISO 4217 currency codes shops price in, from pycountry's copy of the list.

Read from pycountry's data file (``pycountry/databases/iso4217.json``, ~1 ms) rather than
through its API: importing pycountry loads its whole package (~50 ms), and the site spec,
which names a currency, is validated in every process that loads the definitions. Should a
pycountry release move the file, its API is used instead (same list, slower).
"""

from __future__ import annotations

import importlib.util
import json
from functools import lru_cache
from pathlib import Path

#: ISO 4217 codes that are no money a shop prices in: testing, no currency, precious metals, units.
NOT_PRICES = frozenset({"XXX", "XTS", "XAU", "XAG", "XPT", "XPD", "XBA", "XBB", "XBC", "XBD", "XDR", "XSU", "XUA"})


@lru_cache(maxsize=1)
def price_currencies() -> frozenset[str]:
    """Every ISO 4217 alphabetic code (``"EUR"``) but :data:`NOT_PRICES`."""
    found = importlib.util.find_spec("pycountry")  # finds the package without importing it
    try:
        path = Path(found.origin).parent / "databases" / "iso4217.json"  # type: ignore[union-attr, arg-type]
        codes = {entry["alpha_3"] for entry in json.loads(path.read_bytes())["4217"]}
    except (AttributeError, TypeError, OSError, ValueError, KeyError):
        import pycountry

        codes = {currency.alpha_3 for currency in pycountry.currencies}
    return frozenset(codes - NOT_PRICES)


def is_price_currency(code: str) -> bool:
    """Whether ``code`` is an ISO 4217 code shops price in (``"EUR"`` yes; ``"ABC"``, ``"XXX"`` no)."""
    return code in price_currencies()
