"""Collapse rules (pure): floor, sharp drop against history, products to zero, one alert per collapse."""

import pytest

from scrape_assets.collapse import CollapseRules, CollapseState, observe_products, observe_rate

RULES = CollapseRules(floor=0.9, max_drop=0.3, history_size=5, min_history=3)


def test_floor_alerts_once_until_recovered():
    state = CollapseState()
    assert observe_rate(state, "travel", 1.0, RULES) is None
    first = observe_rate(state, "travel", 0.5, RULES)
    assert first == "travel: success rate 50% is below the floor 90%"
    assert observe_rate(state, "travel", 0.4, RULES) is None  # still collapsed: no second alert
    assert observe_rate(state, "travel", 1.0, RULES) is None  # recovered
    assert observe_rate(state, "travel", 0.2, RULES) == "travel: success rate 20% is below the floor 90%"


def test_sharp_drop_against_history_even_above_floor():
    rules = CollapseRules(floor=0.5, max_drop=0.3, min_history=3)
    state = CollapseState()
    for _ in range(3):
        assert observe_rate(state, "all", 1.0, rules) is None
    assert observe_rate(state, "all", 0.6, rules) == "all: success rate 60% dropped from a recent median of 100%"


def test_the_drop_is_measured_from_the_median_of_the_last_history_size_rates():
    rules = CollapseRules(floor=0.1, max_drop=0.3, history_size=3, min_history=3)
    state = CollapseState()
    for rate in (0.2, 0.2, 0.2, 1.0, 1.0, 1.0):
        assert observe_rate(state, "all", rate, rules) is None
    assert state.history["all"] == [1.0, 1.0, 1.0]  # kept to history_size (the sensor's cursor holds it)
    # The median of the last 3 (100%): not of the whole list (20%), nor the last rate (50%).
    drop = "all: success rate 65% dropped from a recent median of 100%"
    assert observe_rate(CollapseState(history={"all": [0.2, 0.2, 0.2, 1.0, 1.0]}), "all", 0.65, rules) == drop
    assert observe_rate(CollapseState(history={"all": [1.0, 1.0, 0.5]}), "all", 0.65, rules) == drop


def test_products_to_zero_and_state_round_trip():
    state = CollapseState()
    assert observe_products(state, "mystery", 32) is None
    assert observe_products(state, "mystery", 0) == "mystery: products parsed fell to zero (its pages failed, a layout change, or an empty site? see dead_letters and the parsed_products_match_schema check)"
    restored = CollapseState.from_dict(state.to_dict())
    assert observe_products(restored, "mystery", 0) is None
    assert observe_products(restored, "mystery", 30) is None
    assert restored.collapsed == {}


def test_a_subject_never_seen_with_products_has_none_so_far_rather_than_a_fall():
    """A first run whose pages all failed (404s on a mirror) has nothing that fell."""
    state = CollapseState()
    assert observe_products(state, "academic", 0, "loaded") == (
        "academic: no rows in the products table so far (its pages failed, or the spec's selectors do not match "
        "the site?)")
    assert observe_products(state, "academic", 12, "loaded") is None
    assert observe_products(state, "academic", 0, "loaded") == (
        "academic: rows in the products table fell to zero (its pages failed, a layout change, or an empty site? see dead_letters and the parsed_products_match_schema check)")
    assert CollapseState.from_dict(state.to_dict()).nonzero == {"products:loaded:academic"}


def test_parsed_and_loaded_counts_are_separate_collapses():
    """Pages failing for days: nothing parsed, the table keeps carried rows; one alert, not one a day."""
    state = CollapseState()
    assert observe_products(state, "travel", 11, "parsed") is None  # a healthy first day
    for day in range(3):
        parsed = observe_products(state, "travel", 0, "parsed")
        assert parsed == ("travel: products parsed fell to zero (its pages failed, a layout change, or an empty site? see dead_letters and the parsed_products_match_schema check)" if day == 0 else None)
        assert observe_products(state, "travel", 11, "loaded") is None  # carried rows: does not clear "parsed"
    assert observe_products(state, "travel", 0, "loaded") == (
        "travel: rows in the products table fell to zero (its pages failed, a layout change, or an empty site? see dead_letters and the parsed_products_match_schema check)")
    assert set(state.collapsed) == {"products:parsed:travel", "products:loaded:travel"}
    assert observe_products(state, "travel", 20, "parsed") is None
    assert set(state.collapsed) == {"products:loaded:travel"}
    with pytest.raises(ValueError, match="source must be one of"):
        observe_products(state, "travel", 1, "table")


def test_a_cursor_state_from_before_the_split_does_not_alert_again():
    old = {"history": {"travel": [1.0]}, "collapsed": {"products:travel": "products fell to zero", "rate:all": "x"}}
    state = CollapseState.from_dict(old)
    assert set(state.collapsed) == {"products:parsed:travel", "products:loaded:travel", "rate:all"}
    assert observe_products(state, "travel", 0, "parsed") is None  # already alerted before the upgrade
    assert observe_products(state, "travel", 5, "loaded") is None and "products:loaded:travel" not in state.collapsed


@pytest.mark.parametrize("median, rate, alerts", [(0.9, 0.6, False), (0.9, 0.59, True), (0.7, 0.4, False),
                                                  (0.7, 0.39, True)])
def test_a_drop_exactly_of_max_drop_does_not_alert(median, rate, alerts):
    """"More than" max_drop, counted exactly: 0.9 - 0.6 is 0.3, not 0.30000000000000004."""
    rules = CollapseRules(floor=0.1, max_drop=0.3, min_history=3)
    state = CollapseState()
    for _ in range(3):
        assert observe_rate(state, "all", median, rules) is None
    assert (observe_rate(state, "all", rate, rules) is not None) is alerts


def test_a_rate_exactly_at_the_floor_is_no_collapse():
    """"Below the floor": 90% of pages done against a 90% floor is healthy, 89% is not."""
    state = CollapseState()
    assert observe_rate(state, "travel", 0.9, RULES) is None
    assert observe_rate(state, "travel", 9 / 10, RULES) is None  # a success rate as the crawl computes it
    assert state.collapsed == {}
    assert observe_rate(state, "travel", 0.89, RULES) == "travel: success rate 89% is below the floor 90%"
