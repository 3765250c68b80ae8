"""Success-rate collapse detection: a pure function over observations and a small state.

A *collapse* of a subject (a category, or a whole run: the sensor's ``RUN_SUBJECT``) is any of:

- its page success rate is below ``floor`` (default 0.9);
- its rate dropped by more than ``max_drop`` (default 0.3) below the median of its
  last ``history_size`` rates (needs ``min_history`` earlier observations);
- the products parsed for it, or the rows of it in the table, fell to zero, or are zero
  on its first observations (two
  separate collapses: a category whose pages fail parses nothing while its table still
  holds the rows carried forward, and neither observation may clear the other).

One alert per collapse: a subject alerts when it enters the collapsed state and again
only after a healthy observation of the same kind has cleared it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from scrape_assets.limits import as_written


#: Where a product count comes from: ``parsed_products`` or ``products_table``.
PRODUCT_SOURCES = ("parsed", "loaded")


@dataclass(frozen=True)
class CollapseRules:
    """Thresholds: ``floor`` and ``max_drop`` are success rates (0..1); sizes count observations."""

    floor: float = 0.9
    max_drop: float = 0.3
    history_size: int = 5
    min_history: int = 3


@dataclass
class CollapseState:
    """JSON-serialisable memory of the sensor (kept in its cursor)."""

    history: dict[str, list[float]] = field(default_factory=dict)
    collapsed: dict[str, str] = field(default_factory=dict)
    #: Product-count keys (``products:<source>:<subject>``) once seen above zero: a zero
    #: there "fell"; a subject never seen with products has "none so far".
    nonzero: set[str] = field(default_factory=set)
    #: Collapses (key -> reason) a healthy observation cleared since this state was made or
    #: loaded; not kept in the cursor (the sensor says each recovery once, then forgets it).
    cleared: dict[str, str] = field(default_factory=dict)
    #: The latest count of each product-count key observed since this state was made or
    #: loaded (for a recovery's text); not kept in the cursor.
    counts: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"history": self.history, "collapsed": self.collapsed, "nonzero": sorted(self.nonzero)}

    @classmethod
    def from_dict(cls, data: dict | None) -> CollapseState:
        data = data or {}
        collapsed = {}
        for key, reason in dict(data.get("collapsed", {})).items():
            kind, _, subject = key.partition(":")
            if kind == "products" and ":" not in subject:  # before parsed and loaded were told apart
                collapsed.update({f"products:{source}:{subject}": reason for source in PRODUCT_SOURCES})
            else:
                collapsed[key] = reason
        return cls(history=dict(data.get("history", {})), collapsed=collapsed, nonzero=set(data.get("nonzero", [])))


def observe_rate(state: CollapseState, subject: str, rate: float, rules: CollapseRules) -> str | None:
    """Record a success rate; return an alert text when the subject newly collapses."""
    history = state.history.get(subject, [])
    reason = None
    if rate < rules.floor:
        reason = f"success rate {rate:.0%} is below the floor {rules.floor:.0%}"
    elif len(history) >= rules.min_history:
        median = statistics.median(history[-rules.history_size :])
        if as_written(median) - as_written(rate) > as_written(rules.max_drop):  # 0.9 - 0.6 is no drop above 0.3
            reason = f"success rate {rate:.0%} dropped from a recent median of {median:.0%}"
    state.history[subject] = (history + [rate])[-rules.history_size :]
    return _transition(state, f"rate:{subject}", reason, subject)


def observe_products(state: CollapseState, subject: str, products: int, source: str = "parsed") -> str | None:
    """Record a product count from ``source`` (one of :data:`PRODUCT_SOURCES`); alert when it newly falls to zero."""
    if source not in PRODUCT_SOURCES:
        raise ValueError(f"source must be one of {PRODUCT_SOURCES}, got {source!r}")
    what = "products parsed" if source == "parsed" else "rows in the products table"
    key = f"products:{source}:{subject}"
    reason = None
    state.counts[key] = products
    if products > 0:
        state.nonzero.add(key)
    elif key in state.nonzero:
        reason = (f"{what} fell to zero (its pages failed, a layout change, or an empty site? see dead_letters and "
                  "the parsed_products_match_schema check)")
    else:  # a first run whose pages failed, or selectors that never matched
        reason = f"no {what} so far (its pages failed, or the spec's selectors do not match the site?)"
    return _transition(state, key, reason, subject)


def _transition(state: CollapseState, key: str, reason: str | None, subject: str) -> str | None:
    if reason is None:
        if (was := state.collapsed.pop(key, None)) is not None:
            state.cleared[key] = was
        return None
    if key in state.collapsed:
        return None  # still collapsed: already alerted
    state.collapsed[key] = reason
    return f"{subject}: {reason}"
