"""Warehouse: delete-then-insert per partition in one transaction, on real SQLite."""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import threading
import time
from decimal import Decimal

import pytest
import sqlalchemy as sa

from scrape_assets.errors import SettingsError
from scrape_assets.warehouse import (
    Warehouse,
    dead_letters,
    insert_many,
    may_recover,
    metadata,
    price_history,
    products,
)


def _row(category, pid, price="9.99"):
    return {
        "category": category, "product_id": pid, "title": f"T{pid}", "price": Decimal(price), "currency": "GBP",
        "rating": 3, "availability": "In stock", "url": f"http://x/{pid}", "page_number": 1,
        "snapshot_id": "s1", "fetched_at": "2026-11-30T08:00:00Z",
    }


def test_replace_partition_is_idempotent_and_scoped(tmp_path):
    wh = Warehouse(f"sqlite:///{tmp_path / 'w.db'}")
    wh.replace_partition(products, "a", [_row("a", "1"), _row("a", "2")])
    wh.replace_partition(products, "b", [_row("b", "1")])
    before = wh.rows(products)
    wh.replace_partition(products, "a", [_row("a", "1"), _row("a", "2")])
    assert wh.rows(products) == before
    assert wh.count(products) == 3 and wh.duplicate_product_keys() == []
    wh.replace_partition(products, "a", [_row("a", "3", "1.50")])
    assert [(r["category"], r["product_id"], r["price"]) for r in wh.rows(products)] == [
        ("a", "3", Decimal("1.50")), ("b", "1", Decimal("9.99"))
    ]


def test_failed_load_keeps_previous_rows(tmp_path):
    wh = Warehouse(f"sqlite:///{tmp_path / 'w.db'}")
    wh.replace_partition(products, "a", [_row("a", "1")])
    with pytest.raises(sa.exc.IntegrityError):
        wh.replace_partition(products, "a", [_row("a", "7"), _row("a", "7")])
    assert [r["product_id"] for r in wh.rows(products)] == ["1"]


@pytest.mark.parametrize("paramstyle", ["qmark", "named"])
def test_insert_many_stores_what_sqlalchemys_insert_stores(tmp_path, paramstyle):
    """Same rows back as Core's insert: qmark (the sqlite3 executemany path) and named (Core's path)."""
    rows = [_row("a", "1", "12.34"), {**_row("a", "2", "0.50"), "extra": "ignored"}, _row("a", "3")]
    rows[2]["title"] = "Ünïcödé £ title"
    read_back = []
    for way in ("core", "insert_many"):
        engine = sa.create_engine(f"sqlite:///{tmp_path / f'{way}-{paramstyle}.db'}", paramstyle=paramstyle)
        assert engine.dialect.positional == (paramstyle == "qmark")
        products.metadata.create_all(engine)
        with engine.begin() as conn:
            if way == "core":
                conn.execute(products.insert(), [{k: v for k, v in r.items() if k != "extra"} for r in rows])
            else:
                insert_many(conn, products, rows)
                insert_many(conn, products, [])  # nothing to insert: no statement
        with engine.connect() as conn:
            read_back.append([dict(r._mapping) for r in conn.execute(sa.select(products).order_by(products.c.product_id))])
    assert read_back[0] == read_back[1]
    assert [(r["product_id"], r["price"], r["title"]) for r in read_back[1]] == [
        ("1", Decimal("12.34"), "T1"), ("2", Decimal("0.50"), "T2"), ("3", Decimal("9.99"), "Ünïcödé £ title")
    ]


def test_insert_many_row_missing_a_column_inserts_nothing(tmp_path):
    wh = Warehouse(f"sqlite:///{tmp_path / 'w.db'}")
    wh.replace_partition(products, "a", [_row("a", "1")])
    incomplete = _row("a", "2")
    del incomplete["url"]
    with pytest.raises(KeyError, match="url"):
        wh.replace_partition(products, "a", [_row("a", "3"), incomplete])
    assert [r["product_id"] for r in wh.rows(products)] == ["1"]


def test_sqlite_uses_wal_and_busy_timeout(tmp_path):
    wh = Warehouse(f"sqlite:///{tmp_path / 'w.db'}")
    with wh.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000




@contextlib.contextmanager
def _another_writer(file):
    """A rollback-journal SQLite file with another connection (own thread) holding its write lock.

    Yields an Event: set it and the writer commits and closes.
    """
    sqlite3.connect(file).close()
    held, release = threading.Event(), threading.Event()

    def hold():
        conn = sqlite3.connect(file, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("CREATE TABLE IF NOT EXISTS other_writer (x)")
        held.set()
        release.wait(30)
        conn.execute("COMMIT")
        conn.close()

    writer = threading.Thread(target=hold)
    writer.start()
    assert held.wait(10)
    try:
        yield release
    finally:
        release.set()
        writer.join(10)


def _counting_sleeps(monkeypatch, then=None) -> list[float]:
    """Record the warehouse's retry sleeps (and call ``then`` after the first one)."""
    from scrape_assets import warehouse

    sleeps, sleep = [], time.sleep

    def counted(seconds):
        sleeps.append(seconds)
        sleep(seconds)
        if then is not None and len(sleeps) == 1:
            then()

    monkeypatch.setattr(warehouse.time, "sleep", counted)
    return sleeps


def test_switch_to_wal_waits_for_a_writer_holding_the_lock(tmp_path, monkeypatch):
    # SQLite refuses the switch's lock upgrade at once while another connection writes (no
    # busy handler), which made processes creating a new warehouse together fail in CI.
    file = tmp_path / "w.db"
    with _another_writer(file) as release:
        sleeps = _counting_sleeps(monkeypatch, then=release.set)  # the writer commits after the first retry
        wh = Warehouse(f"sqlite:///{file}")
        try:
            wh.create_tables()
            assert len(sleeps) >= 1  # refused once, then switched
            with wh.engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert wh.count(products) == 0
        finally:
            wh.close()


def test_switch_to_wal_gives_up_after_the_busy_timeout(tmp_path, monkeypatch):
    from scrape_assets import warehouse

    monkeypatch.setattr(warehouse, "SQLITE_BUSY_TIMEOUT_MS", 1000)
    with _another_writer(tmp_path / "w.db"):
        sleeps = _counting_sleeps(monkeypatch)
        wh = Warehouse(f"sqlite:///{tmp_path / 'w.db'}")
        try:
            with pytest.raises(sa.exc.OperationalError, match="database is locked"):
                wh.create_tables()
        finally:
            wh.close()
    assert len(sleeps) >= 3 and sum(sleeps) <= 1.0  # retried, growing, within the timeout


def test_only_a_busy_database_is_retried():
    from scrape_assets.warehouse import _is_busy

    locked = sqlite3.OperationalError("database is locked")
    assert _is_busy(locked)  # not raised by sqlite3: no result code, the message decides
    locked.sqlite_errorcode = 5 | (3 << 8)  # SQLITE_BUSY_SNAPSHOT: an extended code of SQLITE_BUSY
    assert _is_busy(locked)
    table_locked = sqlite3.OperationalError("database table is locked")
    table_locked.sqlite_errorcode = 6  # SQLITE_LOCKED: another connection of this process; waiting does not help
    assert not _is_busy(table_locked)
    assert not _is_busy(sqlite3.OperationalError("disk I/O error"))


def test_processes_racing_to_create_the_tables_all_succeed(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys; from scrape_assets.warehouse import Warehouse, products; "
        "w = Warehouse(sys.argv[1]); w.create_tables(); print(w.count(products))"
    )
    url = f"sqlite:///{tmp_path / 'race.db'}"
    procs = [subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, [err[-500:] for _, err in results]
    assert [out.strip() for out, _ in results] == ["0"] * 6


def test_decimal_string_prices_load_the_same_table_as_decimals(tmp_path):
    """products_table passes parsed.json's exact price strings on SQLite: same products and price_history."""
    prices = ["12.34", "0.50", "9.99", "51.77", "1000.00", "0.01", "123456.78"]
    tables = []
    for way in ("decimal", "string"):
        wh = Warehouse(f"sqlite:///{tmp_path / f'{way}.db'}")
        assert wh.accepts_decimal_strings
        rows = [_row("a", str(i), p) for i, p in enumerate(prices)]
        if way == "string":
            rows = [{**r, "price": str(r["price"])} for r in rows]
        wh.load_products("a", rows, input_version="v1", snapshot_id="s1", loaded_at="2026-12-01T00:00:00Z",
                         history_date="2026-12-01", history_snapshot_id="s1")
        tables.append((wh.rows(products), wh.rows(price_history)))
        wh.close()
    assert tables[0] == tables[1]
    assert [r["price"] for r in tables[1][0]] == [Decimal(p) for p in prices]
    assert sorted(r["price"] for r in tables[1][1]) == sorted(Decimal(p) for p in prices)


@pytest.mark.parametrize("way", ["upsert", "delete+insert", "old SQLite"],
                         ids=["upsert (SQLite)", "delete+insert (other databases)", "SQLite < 3.24"])
def test_price_history_gets_only_the_prices_seen_that_day(tmp_path, monkeypatch, way):
    """Carried-forward rows (their pages failed) are not stamped with the new day's date.

    Both ways of writing a day's rows give the same table (SQLite's upsert is the default
    there, unless the library predates upserts).
    """
    import functools
    import sqlite3.dbapi2  # SQLAlchemy's sqlite dialect: dialect.dbapi

    from scrape_assets import warehouse

    upsert = way == "upsert"
    if way == "delete+insert":
        monkeypatch.setattr(warehouse, "write_price_history", functools.partial(warehouse.write_price_history, upsert=False))
    elif way == "old SQLite":
        monkeypatch.setattr(sqlite3.dbapi2, "sqlite_version_info", (3, 22, 0))
    wh = Warehouse(f"sqlite:///{tmp_path / 'w.db'}")
    statements = []
    sa.event.listen(wh.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))

    def page_rows(snapshot, prices):  # {product_id: (page_number, price)}
        return [{**_row("a", pid, price), "page_number": page, "snapshot_id": snapshot}
                for pid, (page, price) in prices.items()]

    def load(snapshot, day, rows, failed_pages=()):
        return wh.load_products("a", rows, input_version=f"v-{snapshot}", snapshot_id=snapshot, loaded_at="t",
                                history_date=day, history_snapshot_id=snapshot,
                                carry_unseen=bool(failed_pages))

    def history(day):
        return {(r["product_id"], str(r["price"]), r["snapshot_id"])
                for r in wh.rows(price_history) if r["snapshot_date"] == day}

    assert load("s1", "2026-12-01", page_rows("s1", {"1": (1, "1.00"), "2": (1, "2.00"), "3": (2, "3.00")})) == (3, 0)
    # Next day page 2 fails: product 3 is carried in products, but was not seen on the 2nd.
    assert load("s2", "2026-12-02", page_rows("s2", {"1": (1, "1.10"), "2": (1, "2.10")}), failed_pages={2}) == (2, 1)
    assert {r["product_id"]: r["snapshot_id"] for r in wh.rows(products)} == {"1": "s2", "2": "s2", "3": "s1"}
    assert history("2026-12-01") == {("1", "1.00", "s1"), ("2", "2.00", "s1"), ("3", "3.00", "s1")}
    assert history("2026-12-02") == {("1", "1.10", "s2"), ("2", "2.10", "s2")}
    # The same day again, page 2 back: product 3 seen with its new price, the others replaced, none twice.
    load("s3", "2026-12-02", page_rows("s3", {"1": (1, "1.20"), "2": (1, "2.20"), "3": (2, "3.30")}))
    assert history("2026-12-02") == {("1", "1.20", "s3"), ("2", "2.20", "s3"), ("3", "3.30", "s3")}
    # A later run of that day that sees page 1 only keeps the day's earlier price of product 3.
    load("s4", "2026-12-02", page_rows("s4", {"1": (1, "1.40"), "2": (1, "2.40")}), failed_pages={2})
    assert history("2026-12-02") == {("1", "1.40", "s4"), ("2", "2.40", "s4"), ("3", "3.30", "s3")}
    # Unchanged input next day (rows None): the day gets what the loaded snapshot saw, not the carried row.
    assert wh.load_products("a", None, input_version="v-s4", snapshot_id="s4", loaded_at="t",
                            history_date="2026-12-03", history_snapshot_id="s5") == (0, 0)
    assert history("2026-12-03") == {("1", "1.40", "s5"), ("2", "2.40", "s5")}
    assert len(wh.rows(price_history)) == 3 + 3 + 2
    history_writes = [s for s in statements if "price_history" in s and not s.lstrip().upper().startswith("SELECT")]
    assert any("ON CONFLICT" in s for s in history_writes) == upsert
    # (the delete of rows of products no longer seen, "NOT (EXISTS ...)", is both ways' own)
    assert any(s.lstrip().upper().startswith("DELETE") and "EXISTS" not in s.upper()
               for s in history_writes) == (not upsert)
    # s4 re-parsed on its day with new rules: product 2's id now reads "2b", product 1's card is
    # rejected. The day's rows s4 stamped for 1 and 2 go; s3's row of product 3 (not seen by s4)
    # and the next day's rows stay.
    load("s4", "2026-12-02", page_rows("s4", {"2b": (1, "2.40")}), failed_pages={2})
    assert history("2026-12-02") == {("2b", "2.40", "s4"), ("3", "3.30", "s3")}
    assert history("2026-12-03") == {("1", "1.40", "s5"), ("2", "2.40", "s5")}
    assert len(wh.rows(price_history)) == 3 + 2 + 2


def test_a_product_that_moved_onto_the_page_that_failed_is_carried_not_deleted(tmp_path):
    """A listing re-sorts from day to day: B was on page 1 yesterday, is on page 2 today, and
    page 2 failed. Its row is kept (carried forward) although the page it was loaded from was
    fetched; a product is dropped only by a snapshot that saw every page."""
    wh = Warehouse(f"sqlite:///{tmp_path / 'w.db'}")

    def rows(snapshot, pages):  # {page_number: [product_id, ...]}
        return [{**_row("a", pid, "1.00"), "page_number": page, "snapshot_id": snapshot}
                for page, ids in pages.items() for pid in ids]

    def load(snapshot, pages, *, partial):
        return wh.load_products("a", rows(snapshot, pages), input_version=snapshot, snapshot_id=snapshot,
                                loaded_at="t", history_date="2026-12-01", history_snapshot_id=snapshot,
                                carry_unseen=partial)

    def table():
        return sorted((r["product_id"], r["page_number"], r["snapshot_id"]) for r in wh.rows(products))

    assert load("s1", {1: ["A", "B"], 2: ["C", "D"]}, partial=False) == (4, 0)
    assert load("s2", {1: ["A", "C"]}, partial=True) == (2, 2)  # page 2 (now B and D) failed
    assert table() == [("A", 1, "s2"), ("B", 1, "s1"), ("C", 1, "s2"), ("D", 2, "s1")]
    # s2 re-parsed with new id rules: its own earlier rows are replaced, not carried; s1's still are.
    assert load("s2", {1: ["a", "c"]}, partial=True) == (2, 2)
    assert table() == [("B", 1, "s1"), ("D", 2, "s1"), ("a", 1, "s2"), ("c", 1, "s2")]
    # Every page seen again: D is gone from the site, B shows up on page 2.
    assert load("s3", {1: ["A", "C"], 2: ["B"]}, partial=False) == (3, 0)
    assert table() == [("A", 1, "s3"), ("B", 2, "s3"), ("C", 1, "s3")]
    wh.close()


def test_a_rejected_card_carries_its_own_row_only_and_the_oldest_carried_fetch_is_the_oldest(tmp_path):
    """carry_ids keeps the rows of the cards the snapshot rejected, not those of products that
    left the site (it saw every page); carried_forward() names each category's oldest carried
    fetch, which the summary shows as how stale carried prices may be."""
    wh = Warehouse(f"sqlite:///{tmp_path / 'w.db'}")

    def load(category, snapshot, rows, **carry):
        rows = [{**row, "snapshot_id": snapshot} for row in rows]
        return wh.load_products(category, rows, input_version=snapshot, snapshot_id=snapshot, loaded_at="t",
                                history_date="2026-12-01", history_snapshot_id=snapshot, **carry)

    def fetched(row, at):
        return {**row, "fetched_at": at}

    day1 = [fetched(_row("a", "1"), "2026-11-29T08:00:00Z"), fetched(_row("a", "2"), "2026-11-30T08:00:00Z"),
            fetched(_row("a", "3"), "2026-12-01T08:00:00Z")]
    assert load("a", "s1", day1) == (3, 0)
    assert load("a", "s2", [fetched(_row("a", "1"), "2026-12-02T08:00:00Z")], carry_ids={"2"}) == (1, 1)
    assert sorted((r["product_id"], r["snapshot_id"]) for r in wh.rows(products, "a")) == [("1", "s2"), ("2", "s1")]
    # Category b: two rows carried (page 2 failed), fetched on different days.
    day1 = [fetched(_row("b", "1"), "2026-12-01T08:00:00Z"), fetched(_row("b", "2"), "2026-11-28T08:00:00Z"),
            fetched(_row("b", "3"), "2026-12-01T09:00:00Z")]
    assert load("b", "s1", day1) == (3, 0)
    assert load("b", "s2", [fetched(_row("b", "1"), "2026-12-02T08:00:00Z")], carry_unseen=True) == (1, 2)
    assert wh.carried_forward() == {"a": (1, "2026-11-30T08:00:00Z"), "b": (2, "2026-11-28T08:00:00Z")}
    wh.close()


def test_the_first_site_to_load_claims_the_tables_and_another_is_refused(tmp_path, monkeypatch):
    """Tables are keyed by category: a second site's ``travel`` would silently replace the first's."""
    from scrape_assets.errors import SettingsError

    url = f"sqlite:///{tmp_path / 'w.db'}"
    wh = Warehouse(url)
    assert wh.site() is None
    wh.check_site("books_toscrape")  # unclaimed: anyone may
    wh.claim_site("demo", now="2026-12-01T00:00:00Z")
    Warehouse(url).claim_site("demo", now="2026-12-02T00:00:00Z")  # the same site again, another process
    assert wh.site() == "demo"
    refused = r"expected the warehouse of site 'books_toscrape' \(this one holds site 'demo'.*SCRAPE_WAREHOUSE_URL\)"
    with pytest.raises(SettingsError, match=refused):
        Warehouse(url).claim_site("books_toscrape", now="2026-12-02T00:00:00Z")
    with pytest.raises(SettingsError, match=refused):
        Warehouse(url).check_site("books_toscrape")
    # Two sites racing past the "unclaimed?" read: the single-row table lets one claim win.
    other = Warehouse(f"sqlite:///{tmp_path / 'race.db'}")
    other.claim_site("demo", now="t")
    real_site, calls = Warehouse.site, []

    def unclaimed_at_first(self):  # the other claim lands between this read and the insert
        calls.append(1)
        return None if len(calls) == 1 else real_site(self)

    monkeypatch.setattr(Warehouse, "site", unclaimed_at_first)
    late = Warehouse(f"sqlite:///{tmp_path / 'race.db'}")
    with pytest.raises(SettingsError, match="this one holds site 'demo'"):
        late.claim_site("books_toscrape", now="t")  # insert conflicts even though it read None first
    monkeypatch.undo()
    assert Warehouse(f"sqlite:///{tmp_path / 'race.db'}").site() == "demo"


def test_a_warehouse_loaded_before_claims_is_claimed_only_by_a_site_whose_snapshot_it_loaded(tmp_path):
    from scrape_assets.errors import SettingsError
    from scrape_assets.warehouse import partition_loads

    url = f"sqlite:///{tmp_path / 'w.db'}"
    old = Warehouse(url)
    old.load_products("travel", [_row("travel", "1")], input_version="v", snapshot_id="2026-11-30T000000Z",
                      loaded_at="t", history_date="2026-11-30", history_snapshot_id="2026-11-30T000000Z")
    with old.engine.begin() as conn:  # as an earlier version left it: loads, no claim
        conn.execute(sa.text("DELETE FROM warehouse_site"))
    assert len(old.rows(partition_loads)) == 1
    with pytest.raises(SettingsError, match=r"none of its 1 loads is a snapshot of 'books_toscrape'; if it is this "
                                            r"site's, claim it with INSERT INTO warehouse_site"):
        Warehouse(url).claim_site("books_toscrape", now="t", owns=lambda category, snapshot: False)
    assert Warehouse(url).site() is None
    seen = []
    Warehouse(url).claim_site("demo", now="t", owns=lambda category, snapshot: seen.append((category, snapshot)) or True)
    assert seen == [("travel", "2026-11-30T000000Z")] and Warehouse(url).site() == "demo"


def test_run_wide_queries_answer_for_the_given_categories_only(tmp_path, monkeypatch):
    from scrape_assets import warehouse

    wh = Warehouse(f"sqlite:///{tmp_path / 'w.db'}")
    for category, ids, second in (("a", "12", "05"), ("b", "1", "06"), ("c", "123", "07")):
        wh.load_products(category, [_row(category, pid) for pid in ids], input_version=f"v-{category}",
                         snapshot_id="s1", loaded_at=f"2026-12-01T10:00:{second}Z", history_date="2026-12-01",
                         history_snapshot_id="s1")
    for chunk in (500, 1):  # one IN list, or one per category (as past SQLite's bound-variable limit)
        monkeypatch.setattr(warehouse, "_IN_CHUNK", chunk)
        assert list(wh.rows_by_category(products, ["c", "a", "zz"]).items()) == [("a", 2), ("c", 3)]  # no rows, no entry
        assert list(wh.rows_by_category(products).items()) == [("a", 2), ("b", 1), ("c", 3)]
        assert wh.rows_by_category(products, []) == {}
        assert wh.loaded_versions(products, {"a", "c", "zz"}) == {"a": "v-a", "c": "v-c"}
        # loaded in that second or later (what a retried step's earlier attempt loaded since the run began)
        assert wh.loaded_since(products, ["a", "b", "c", "zz"], "2026-12-01T10:00:06Z") == {"b", "c"}
        assert wh.loaded_since(products, ["a", "b"], "2026-12-01T10:00:08Z") == set()
        assert wh.loaded_since(products, [], "2026-12-01T10:00:00Z") == set()
        assert wh.duplicate_product_keys(["a", "b"]) == []
    with pytest.raises(TypeError, match="the string 'a'"):
        wh.duplicate_product_keys("a")  # a category name is not a list of them


def test_insert_many_stores_decimal_strings_as_sqlalchemys_insert_does(tmp_path):
    """Prices as exact strings (products_table's SQLite path) store what Core's insert stores."""
    rows = [{**_row("a", str(n)), "price": price} for n, price in enumerate(["12.34", "0.50", "51.00", "1e1"])]
    read_back = []
    for way in ("core", "insert_many"):
        wh = Warehouse(f"sqlite:///{tmp_path / f'{way}.db'}")
        wh.create_tables()
        with wh.engine.begin() as conn:
            if way == "core":
                conn.execute(products.insert(), rows)
            else:
                insert_many(conn, products, rows)
        with wh.engine.connect() as conn:
            raw = conn.exec_driver_sql("SELECT product_id, price, typeof(price) FROM products ORDER BY product_id")
            read_back.append(raw.all())
    assert read_back[0] == read_back[1]
    assert [tuple(r) for r in read_back[1]] == [("0", 12.34, "real"), ("1", 0.5, "real"), ("2", 51, "integer"),
                                               ("3", 10, "integer")]


def test_existing_tables_creates_nothing(tmp_path):
    path = tmp_path / "none" / "w.db"
    wh = Warehouse(f"sqlite:///{path}")
    assert wh.existing_tables() == set()
    assert not path.parent.exists()  # neither the folder nor the SQLite file
    path.parent.mkdir()
    empty = Warehouse(f"sqlite:///{path}")
    with empty.engine.connect():  # an empty database file: no tables yet
        pass
    assert path.exists() and empty.existing_tables() == set()
    empty.create_tables()
    assert empty.existing_tables() == set(metadata.tables)


def test_a_read_only_uri_warehouse_is_found_and_read_without_writing(tmp_path, monkeypatch):
    folder = tmp_path / "a b"
    folder.mkdir()
    Warehouse(f"sqlite:///{folder / 'w.db'}").load_products(
        "a", [_row("a", "1")], input_version="v", snapshot_id="s1", loaded_at="t", history_date="2026-12-01",
        history_snapshot_id="s1")
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///file:{tmp_path}/a%20b/w.db?mode=ro&uri=true"
    read_only = Warehouse(uri)
    assert read_only.existing_tables() == set(metadata.tables)
    assert read_only.rows_by_category(products) == {"a": 1} and read_only.site() is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a b"]  # no stray "file:..." folder
    assert Warehouse(f"sqlite:///file:{tmp_path}/none.db?mode=ro&uri=true").existing_tables() == set()


def test_a_reader_warehouse_changes_nothing_in_the_file(tmp_path):
    """create=False (the summary): no table created, and the journal mode of the file left as it was."""
    import sqlite3

    path = tmp_path / "w.db"
    with Warehouse(f"sqlite:///{path}") as writer:
        writer.load_products("a", [_row("a", "1")], input_version="v", snapshot_id="s1", loaded_at="t",
                             history_date="2026-12-01", history_snapshot_id="s1")
    with sqlite3.connect(path) as conn:  # as an older warehouse, or one copied elsewhere, may be
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("DROP TABLE dead_letters")
    before = path.read_bytes()
    reader = Warehouse(f"sqlite:///{path}", create=False)
    assert "dead_letters" not in reader.existing_tables() and reader.rows_by_category(products) == {"a": 1}
    with pytest.raises(sa.exc.OperationalError, match="no such table: dead_letters"):
        reader.count(dead_letters)
    reader.close()
    assert path.read_bytes() == before and not (tmp_path / "w.db-wal").exists()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    empty = tmp_path / "empty.db"
    empty.touch()
    assert Warehouse(f"sqlite:///{empty}", create=False).existing_tables() == set()
    assert empty.stat().st_size == 0


def test_a_reader_reads_a_wal_warehouse_in_a_folder_it_may_not_write(tmp_path, monkeypatch):
    """A read-only mount or another user's data folder: SQLite could not create the -shm file a
    WAL reader needs ("unable to open database file"), so the summary reads the file as immutable."""
    import scrape_assets.warehouse as warehouse_module

    path = tmp_path / "w.db"
    with Warehouse(f"sqlite:///{path}") as writer:  # WAL, as the pipeline leaves it
        writer.load_products("a", [_row("a", "1"), _row("a", "2")], input_version="v", snapshot_id="s1",
                             loaded_at="t", history_date="2026-12-01", history_snapshot_id="s1")
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()
    assert not (tmp_path / "w.db-shm").exists()  # closed: no connection has it open
    # As root, os.access says every folder is writable: the folder's verdict is what the test sets.
    monkeypatch.setattr(warehouse_module, "_folder_writable", lambda folder: folder != tmp_path)
    reader = Warehouse(f"sqlite:///{path}", create=False)
    with reader.engine.connect() as conn:  # while it reads, nothing is created beside the file
        assert conn.execute(sa.select(sa.func.count()).select_from(products)).scalar_one() == 2
        assert sorted(p.name for p in tmp_path.iterdir()) == ["w.db"]
    assert reader.rows_by_category(products) == {"a": 2}
    assert reader.describe() == f"sqlite:///{path}"
    reader.close()
    # A copy whose last commit is still in its -wal (taken without the -shm): an immutable read
    # would miss that commit, so it is opened as usual (here it can be: the folder is writable).
    copy = tmp_path / "copy"
    copy.mkdir()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("INSERT INTO products SELECT category, '3', title, price, currency, rating, availability, url, "
                 "page_number, snapshot_id, fetched_at FROM products WHERE product_id = '1'")
    conn.commit()
    for suffix in ("", "-wal"):
        (copy / f"w.db{suffix}").write_bytes((tmp_path / f"w.db{suffix}").read_bytes())
    conn.close()
    monkeypatch.setattr(warehouse_module, "_folder_writable", lambda folder: folder not in (tmp_path, copy))
    with Warehouse(f"sqlite:///{copy / 'w.db'}", create=False) as from_copy:
        assert from_copy.rows_by_category(products) == {"a": 3}
    (tmp_path / "w.db-journal").write_bytes(b"")  # a rollback journal beside it: not read as immutable either
    with Warehouse(f"sqlite:///{path}", create=False) as beside_journal, beside_journal.engine.connect() as held:
        assert held.execute(sa.select(sa.func.count()).select_from(products)).scalar_one() == 3
        assert (tmp_path / "w.db-shm").exists()  # an ordinary WAL read
    (tmp_path / "w.db-journal").unlink()
    # A writer has it open (its -shm file is there): an ordinary read, which sees the writer's commits.
    with Warehouse(f"sqlite:///{path}") as writer, writer.engine.connect() as held:
        held.execute(sa.select(sa.func.count()).select_from(products)).scalar_one()
        assert (tmp_path / "w.db-shm").exists()
        writer.load_products("a", [_row("a", "1")], input_version="v2", snapshot_id="s2", loaded_at="t",
                             history_date="2026-12-02", history_snapshot_id="s2")
        with Warehouse(f"sqlite:///{path}", create=False) as second:
            assert second.rows_by_category(products) == {"a": 1}


def test_duplicate_product_keys_looks_only_at_the_given_categories(tmp_path):
    wh = Warehouse(f"sqlite:///{tmp_path / 'w.db'}")
    with wh.engine.begin() as conn:  # a products table without its key (a warehouse made by hand)
        conn.exec_driver_sql(
            "CREATE TABLE products (category TEXT, product_id TEXT, title TEXT, price NUMERIC, currency TEXT, "
            "rating INTEGER, availability TEXT, url TEXT, page_number INTEGER, snapshot_id TEXT, fetched_at TEXT)")
        insert_many(conn, products, [_row("a", "1"), _row("a", "1"), _row("b", "2"), _row("b", "2"), _row("c", "3")])
    assert wh.duplicate_product_keys(["a", "c"]) == [("a", "1", 2)]
    assert sorted(wh.duplicate_product_keys()) == [("a", "1", 2), ("b", "2", 2)]
    assert wh.duplicate_product_keys([]) == []


def _sqlite_error(url: str, sql: str, *, holder: str | None = None) -> sa.exc.SQLAlchemyError:
    """The error SQLAlchemy raises running ``sql`` on a real SQLite database (``holder``: SQL run first, kept open)."""
    engine = sa.create_engine(url, connect_args={"timeout": 0})
    other = sa.create_engine(url).connect() if holder else None
    try:
        if other is not None:
            other.exec_driver_sql(holder)  # an open write transaction: the database is locked for others
        with engine.begin() as conn:
            conn.exec_driver_sql(sql)
    except sa.exc.SQLAlchemyError as exc:
        return exc
    finally:
        if other is not None:
            other.close()
        engine.dispose()
    raise AssertionError(f"{sql!r} did not fail")


def test_may_recover_tells_a_locked_or_missing_sqlite_database_from_one_no_retry_helps(tmp_path):
    url = f"sqlite:///{tmp_path / 'w.db'}"
    with sqlite3.connect(tmp_path / "w.db") as conn:
        conn.execute("CREATE TABLE t (a INTEGER)")
    conn.close()
    (tmp_path / "notes.db").write_text("not a database")
    (tmp_path / "folder.db").mkdir()
    locked = _sqlite_error(url, "INSERT INTO t VALUES (1)", holder="BEGIN EXCLUSIVE")
    assert "database is locked" in str(locked) and may_recover(locked)
    cannot_open = _sqlite_error(f"sqlite:///{tmp_path / 'folder.db'}", "SELECT 1")
    assert "unable to open database file" in str(cannot_open) and may_recover(cannot_open)
    no_column = _sqlite_error(url, "SELECT price FROM t")
    assert "no such column" in str(no_column) and not may_recover(no_column)
    not_a_db = _sqlite_error(f"sqlite:///{tmp_path / 'notes.db'}", "SELECT * FROM t")
    assert "file is not a database" in str(not_a_db) and not may_recover(not_a_db)


class _DriverError(Exception):
    """A stand-in for a PostgreSQL driver's exception (pure classification logic)."""

    def __init__(self, *args, sqlstate=None, pgcode=None):
        super().__init__(*args)
        self.sqlstate, self.pgcode = sqlstate, pgcode


@pytest.mark.parametrize(
    ("error", "recoverable"),
    [
        (sa.exc.OperationalError("SELECT 1", {}, _DriverError("server closed the connection", sqlstate="08006")), True),
        (sa.exc.OperationalError("SELECT 1", {}, _DriverError("the database system is starting up",
                                                               sqlstate="57P03")), True),
        (sa.exc.OperationalError("SELECT 1", {}, _DriverError("deadlock detected", pgcode="40P01")), True),  # psycopg2
        (sa.exc.OperationalError("SELECT 1", {}, _DriverError("too many connections", sqlstate="53300")), True),
        # A table another writer holds locked past lock_timeout; its class (55) is otherwise permanent.
        (sa.exc.OperationalError("SELECT 1", {}, _DriverError("canceling statement due to lock timeout",
                                                               sqlstate="55P03")), True),
        (sa.exc.OperationalError("SELECT 1", {}, _DriverError("object is in use", sqlstate="55006")), False),
        (sa.exc.OperationalError("SELECT 1", {}, _DriverError("password authentication failed",
                                                               sqlstate="28P01")), False),
        (sa.exc.OperationalError("SELECT 1", {}, _DriverError('database "shop" does not exist',
                                                               sqlstate="3D000")), False),
        (sa.exc.ProgrammingError("SELECT 1", {}, _DriverError({"C": "42703", "M": "column does not exist"})), False),
        (sa.exc.InterfaceError("SELECT 1", {}, _DriverError({"C": "08001", "M": "cannot connect"})), True),  # pg8000
        (sa.exc.OperationalError("SELECT 1", {}, _DriverError("connection refused")), True),  # no code at all
        # psycopg and psycopg2 give no SQLSTATE when the connection itself fails: the message decides.
        (sa.exc.OperationalError("SELECT 1", {}, _DriverError(
            'connection failed: FATAL:  password authentication failed for user "scraper"')), False),
        (sa.exc.OperationalError("SELECT 1", {}, _DriverError(
            'connection failed: FATAL:  database "shop" does not exist')), False),
        (sa.exc.OperationalError("SELECT 1", {}, _DriverError(
            "connection failed: FATAL:  the database system is starting up")), True),
        (sa.exc.OperationalError("SELECT 1", {}, _DriverError(
            'could not connect to server: Connection refused\n\tIs the server running on host "db"?')), True),
        # sqlite3 before Python 3.11: no result code either.
        (sa.exc.OperationalError("SELECT x FROM t", {}, _DriverError("no such column: x")), False),
        (sa.exc.OperationalError("INSERT INTO t VALUES (1)", {}, _DriverError("database is locked")), True),
        (sa.exc.ProgrammingError("SELECT 1", {}, _DriverError("syntax error")), False),
        (sa.exc.DBAPIError("SELECT 1", {}, _DriverError("gone"), connection_invalidated=True), True),
    ],
)
def test_may_recover_reads_the_sqlstate_class_of_a_postgresql_error(error, recoverable):
    assert may_recover(error) is recoverable


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://scraper:hunter2@db.internal:5432/shop", "postgresql://scraper:***@db.internal:5432/shop"),
        ("postgresql://scraper@db.internal/shop?password=hunter2&sslmode=require",
         "postgresql://scraper@db.internal/shop?sslmode=require&password=***"),  # the target shown, secrets not
        ("postgresql://scraper@/shop?host=/run/pg&sslpassword=hunter2", "postgresql://scraper@/shop?host=%2Frun%2Fpg&sslpassword=***"),
        ("postgresql://scraper@azure-srv:hunter2@db.internal/shop", "postgresql://scraper%40azure-srv:***@db.internal/shop"),
        ("sqlite:////data/warehouse.db", "sqlite:////data/warehouse.db"),
    ],
)
def test_a_warehouse_is_described_without_its_password_wherever_the_url_holds_it(url, shown):
    """``describe()`` feeds logs, run metadata and errors: libpq takes ``?password=`` too."""
    assert Warehouse(url).describe() == shown


@pytest.mark.parametrize("password", ["Pa55@SECRET-TAIL", "Pa55/x@SECRET-TAIL", "Pa55?x@SECRET-TAIL", "Pa55#x@SECRET-TAIL",
                                      # an "@" before the "/" or "?": host "SECRET", the rest database or dropped
                                      "Pa55@SECRET/TAIL", "Pa55@SECRET?TAIL", "Pa55@SECRET?sslmode=require",
                                      "Pa55@[SECRET]x"])
def test_an_unencoded_at_sign_in_the_password_is_refused_showing_none_of_it(password):
    """SQLAlchemy would split ``Pa55@word`` at its ``@``: password "Pa55", host "word@db...",
    and the driver's "failed to resolve host" would print the rest of the password."""
    with pytest.raises(SettingsError) as refused:
        Warehouse(f"postgresql://scraper:{password}@db.internal:5432/shop")
    message = str(refused.value)
    assert "SCRAPE_WAREHOUSE_URL" in message and "%40" in message and "PGPASSWORD" in message
    assert "SECRET" not in message and "Pa55" not in message
    for fine in ("postgresql://scraper:Pa55?word@db.internal/shop",  # "?" and "/" in a password parse right
                 "postgresql://scraper:Pa55/word@db.internal:5432/shop?sslmode=require",
                 "postgresql://user@server:pw@db.postgres.database.azure.com/shop",  # Azure's user@server
                 "postgresql://scraper:pw@db.internal/my%40db", "postgresql://scraper:pw@/shop?host=/var/run/postgresql",
                 "postgresql://scraper:Pa55%40SECRET@db.internal/shop?options=a%40b"):
        Warehouse(fine).close()


def test_a_missing_postgresql_driver_names_the_extra_that_installs_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # "import psycopg" now fails as if not installed
    with pytest.raises(SettingsError) as refused:
        Warehouse("postgresql://scraper:hunter2@db.internal/shop")
    assert "driver is installed" in str(refused.value) and "pip install -e '.[postgres]'" in str(refused.value)
    assert "hunter2" not in str(refused.value)
    assert "postgresql://scraper:***@db.internal/shop" in str(refused.value)  # whose URL: the user name stays


def test_a_missing_psycopg2_driver_says_what_installs_it_or_which_url_needs_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    with pytest.raises(SettingsError) as refused:
        Warehouse("postgresql+psycopg2://scraper:hunter2@db.internal/shop?sslpassword=hunter3")
    message = str(refused.value)
    assert "pip install -e '.[dagster-postgres]'" in message and "write postgresql:// for psycopg 3" in message
    assert "postgresql+psycopg2://scraper:***@db.internal/shop?sslpassword=***" in message
    assert "hunter2" not in message and "hunter3" not in message


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:///data/warehouse.db", "expected an absolute path: sqlite:////absolute/path/warehouse.db (four slashes)"),
        ("sqlite:///~/warehouse.db", "expected an absolute path"),  # SQLite would make a folder named "~"
        ("sqlite:///file:data/w.db?mode=rw&uri=true", "expected an absolute path"),
        ("sqlite://", "expected a database file that outlives the process"),
        ("sqlite:///:memory:", "expected a database file that outlives the process"),
    ],
)
def test_a_sqlite_warehouse_in_memory_or_at_a_relative_path_is_refused(tmp_path, monkeypatch, url, expected):
    """Each process (the CLI, the UI's code server, a run worker) has its own current folder
    and memory: such a warehouse would split into several, or keep nothing. The URL is shown
    as set, and where a relative one would have landed from here."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SettingsError) as refused:
        Warehouse(url)
    assert str(refused.value).startswith(f"SCRAPE_WAREHOUSE_URL='{url.split('?')[0]}' is invalid: {expected}")
    if "absolute path" in expected:
        assert f"(this one is {tmp_path}/" in str(refused.value)
    assert list(tmp_path.iterdir()) == []  # no file or folder made


def test_may_recover_reads_the_primary_code_of_an_extended_sqlite_error(tmp_path):
    """A WAL reader whose snapshot went stale before it wrote gets SQLITE_BUSY_SNAPSHOT (517, an
    extended SQLITE_BUSY): the busy handler does not retry it, a new transaction succeeds."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    with sqlite3.connect(tmp_path / "w.db") as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (a INTEGER)")
    conn.close()
    stale, other = sa.create_engine(url), sa.create_engine(url)
    try:
        with stale.connect() as reader:
            reader.exec_driver_sql("BEGIN")
            reader.exec_driver_sql("SELECT count(*) FROM t").scalar_one()  # the read snapshot is taken
            with other.begin() as writer:
                writer.exec_driver_sql("INSERT INTO t VALUES (1)")
            with pytest.raises(sa.exc.OperationalError) as info:
                reader.exec_driver_sql("INSERT INTO t VALUES (2)")
            reader.rollback()
    finally:
        stale.dispose()
        other.dispose()
    assert info.value.orig.sqlite_errorcode == 517 and "database is locked" in str(info.value)
    assert may_recover(info.value)


def test_a_writers_connection_syncs_normally_in_wal_and_a_readers_changes_nothing(tmp_path):
    """synchronous=NORMAL: WAL's setting that keeps every commit through a crash of the process
    (a power loss may lose the last ones) without an fsync per commit."""
    path = tmp_path / "w.db"
    with Warehouse(f"sqlite:///{path}") as wh, wh.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL (FULL is 2)
        wh.create_tables()
    with Warehouse(f"sqlite:///{path}", create=False) as reader, reader.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000


def test_an_empty_wal_file_beside_a_warehouse_in_an_unwritable_folder_still_reads_it_as_immutable(tmp_path, monkeypatch):
    """Only a -wal with content holds commits the file lacks: an empty one (left by a copy, or a
    checkpoint that truncated it) does not stop the immutable read, which needs no -shm."""
    import scrape_assets.warehouse as warehouse_module

    path = tmp_path / "w.db"
    with Warehouse(f"sqlite:///{path}") as writer:
        writer.load_products("a", [_row("a", "1"), _row("a", "2")], input_version="v", snapshot_id="s1",
                             loaded_at="t", history_date="2026-12-01", history_snapshot_id="s1")
    (tmp_path / "w.db-wal").write_bytes(b"")
    monkeypatch.setattr(warehouse_module, "_folder_writable", lambda folder: folder != tmp_path)
    with Warehouse(f"sqlite:///{path}", create=False) as reader, reader.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(products)).scalar_one() == 2
        assert sorted(p.name for p in tmp_path.iterdir()) == ["w.db", "w.db-wal"]  # no -shm: read as immutable


def test_rows_of_loaded_snapshots_leaves_carried_rows_out(tmp_path):
    wh = Warehouse(f"sqlite:///{tmp_path / 'w.db'}")

    def load(snapshot, ids, *, partial):
        rows = [{**_row("a", pid), "snapshot_id": snapshot} for pid in ids]
        return wh.load_products("a", rows, input_version=snapshot, snapshot_id=snapshot, loaded_at="t",
                                history_date="2026-12-01", history_snapshot_id=snapshot, carry_unseen=partial)

    assert load("s1", ["A", "B", "C"], partial=False) == (3, 0)
    assert load("s2", ["A"], partial=True) == (1, 2)  # B and C carried from s1
    assert wh.rows_by_category(products) == {"a": 3}
    assert wh.rows_of_loaded_snapshots(["a", "b"]) == {"a": 1}
    wh.close()


@pytest.mark.parametrize("url", ["postgresql+psycopg_2://scraper:S3CRET@db/shop", "oracle+cx_oracle://scott:S3CRET@db:abc/x"])
def test_a_refused_warehouse_url_with_an_underscore_in_its_driver_shows_no_password(url):
    """urlsplit reads no scheme with an "_" in it, and redact_url returned such a URL whole, as
    a plain path: a mistyped driver or a port that is no number printed the password."""
    with pytest.raises(SettingsError) as refused:
        Warehouse(url)
    assert "S3CRET" not in str(refused.value) and f"'{url.split('://')[0]}://<hidden>'" in str(refused.value)
