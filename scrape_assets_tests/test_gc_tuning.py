"""SCRAPE_GC_FREEZE: the definitions freeze the collector's long-lived objects and skip its exit passes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from scrape_assets.errors import SettingsError
from scrape_assets.gc_tuning import gc_freeze_enabled

# Registered before the definitions load, so it runs after their exit hook (atexit is LIFO).
_PROBE = """
import atexit, gc, sys
atexit.register(lambda: print("at exit: collector enabled", gc.isenabled(), "frozen", gc.get_freeze_count() > 0))
import scrape_assets.definitions
print("after load: frozen objects", gc.get_freeze_count())
import scrape_assets.crawl  # raw_pages's step imports the HTTP stack, then freezes again
from scrape_assets.gc_tuning import freeze_again
before = gc.get_freeze_count()
freeze_again()
print("after the step's imports: frozen more", gc.get_freeze_count() - before > 10_000)
"""


def _probe(value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SCRAPE_GC_FREEZE"}
    if value is not None:
        env["SCRAPE_GC_FREEZE"] = value
    return subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)


def test_loading_the_definitions_freezes_what_is_loaded_and_exit_skips_the_collector():
    done = _probe(None)
    assert done.returncode == 0, done.stderr[-2000:]
    first, step, last = done.stdout.strip().splitlines()
    # Dagster and these modules: well over 100,000 objects the collector no longer walks.
    assert int(first.rsplit(" ", 1)[1]) > 100_000
    assert step == "after the step's imports: frozen more True"  # httpx, aiohttp and their modules too
    assert last == "at exit: collector enabled False frozen True"


def test_zero_keeps_pythons_defaults():
    done = _probe("0")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines() == [
        "after load: frozen objects 0", "after the step's imports: frozen more False",
        "at exit: collector enabled True frozen False"]


def test_a_bad_value_names_the_variable():
    done = _probe("yes")
    assert done.returncode != 0
    assert "SCRAPE_GC_FREEZE='yes' is invalid: expected 0 (Python's default collector) or 1 (freeze; the default)" in done.stderr


@pytest.mark.parametrize(("value", "enabled"), [(None, True), ("", True), ("1", True), (" 0 ", False)])
def test_values(value, enabled):
    assert gc_freeze_enabled({} if value is None else {"SCRAPE_GC_FREEZE": value}) is enabled
    with pytest.raises(SettingsError):
        gc_freeze_enabled({"SCRAPE_GC_FREEZE": "2"})


_EXIT_PROBE = """
import atexit, gc
seen = {}
atexit.register(lambda: print("objects of the run frozen at exit", gc.get_freeze_count() > seen["before exit"]))
import scrape_assets.definitions
run = [[i] for i in range(20_000)]  # what a run leaves alive until the interpreter exits
seen["before exit"] = gc.get_freeze_count()
"""


@pytest.mark.parametrize(("value", "frozen"), [(None, True), ("0", False)])
def test_exit_freezes_what_the_run_created_too(value, frozen):
    """The final collections walk objects created after the definitions' freeze unless exit freezes them."""
    env = {k: v for k, v in os.environ.items() if k != "SCRAPE_GC_FREEZE"}
    if value is not None:
        env["SCRAPE_GC_FREEZE"] = value
    done = subprocess.run([sys.executable, "-c", _EXIT_PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"objects of the run frozen at exit {frozen}"
