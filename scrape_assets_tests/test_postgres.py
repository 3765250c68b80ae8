"""The warehouse on a real PostgreSQL server (pgserver: PostgreSQL's own binaries, pip-installed).

SQLite is the default and the rest of the suite runs on it; PostgreSQL is what production
uses, and it differs where it matters: declared sizes are enforced (a row SQLite would take
can make PostgreSQL refuse a whole partition), concurrent DDL collides in its catalog, and
the price history is written without SQLite's upsert.
"""

from __future__ import annotations

import datetime
import threading
import uuid

import pytest

from scrape_assets.warehouse import Warehouse, dead_letters, price_history, products
from scrape_assets_tests.conftest import make_resources, materialize, run_metadata, serving

# pgserver asks platformdirs for a runtime folder; without XDG_RUNTIME_DIR it falls back to /tmp and says so.
pytestmark = pytest.mark.filterwarnings("ignore:XDG_RUNTIME_DIR is not set")


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory):
    import pgserver

    server = pgserver.get_server(tmp_path_factory.mktemp("pg"), cleanup_mode="stop")
    yield server
    server.cleanup()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """A new, empty database on the test server, as a SQLAlchemy URL (driver psycopg 3)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    postgres_server.psql(f"CREATE DATABASE {name};")
    return f"postgresql+psycopg://postgres@/{name}?host={postgres_server.pgdata}"


def _on_postgres(tmp_path, url: str, **site) -> dict:
    from scrape_assets.defs.resources import WarehouseResource

    return {**make_resources(tmp_path, **site), "warehouse": WarehouseResource(url=url)}


def test_the_pipeline_loads_postgresql_and_a_rerun_or_the_next_day_duplicates_nothing(tmp_path, instance, postgres_url,
                                                                                         monkeypatch):
    from scrape_assets.demo_site import DATE_ENV_VAR, catalogue, changed_categories

    keys = ["travel", "mystery", "classics", "romance", "fiction", "default"]
    today = datetime.datetime.now(datetime.timezone.utc).date()
    # The demo's two days: a fixed pair on which some of these categories change prices (on
    # many real pairs of days none of these six changes, and the second day would prove nothing).
    first_day = datetime.date(2026, 1, 1)
    while not changed_categories(first_day + datetime.timedelta(days=1)) & set(keys):
        first_day += datetime.timedelta(days=1)
    next_day = first_day + datetime.timedelta(days=1)
    res = _on_postgres(tmp_path, postgres_url)
    wh = Warehouse(postgres_url)

    def expected(day) -> dict:
        return {(k, str(p.id)): p.price for k in keys for p in catalogue(day).category(k).products}

    monkeypatch.setenv(DATE_ENV_VAR, first_day.isoformat())  # the in-process demo catalogue's day
    assert materialize(instance, res, keys).success
    assert {(r["category"], r["product_id"]): r["price"] for r in wh.rows(products)} == expected(first_day)
    again = materialize(instance, res, keys)  # the same day: every page a 304, nothing reloaded
    assert again.success and run_metadata(again)["products_table"]["rows_loaded"] == 0

    monkeypatch.setenv(DATE_ENV_VAR, next_day.isoformat())
    assert materialize(instance, res, keys).success
    rows = wh.rows(products)
    assert {(r["category"], r["product_id"]): r["price"] for r in rows} == expected(next_day) != expected(first_day)
    assert wh.duplicate_product_keys() == []
    # One price_history row per product and real UTC day (all three runs ran today): the latest price.
    history = wh.rows(price_history)
    assert len(history) == len(rows)
    assert {(r["category"], r["product_id"]): r["price"] for r in history} == expected(next_day)
    assert {r["snapshot_date"] for r in history} == {today.isoformat()}


def test_a_card_beyond_the_columns_is_a_parse_dead_letter_not_a_refused_partition(tmp_path, instance, postgres_url):
    """A 65-character id: VARCHAR(64) on PostgreSQL would refuse the whole partition's load."""
    from scrape_assets.demo_site import DemoRequestHandler, DemoResponse, DemoServer, catalogue

    travel = catalogue().category("travel")
    first = travel.products[0]
    link, long_link = f"/{first.slug}_{first.id}/".encode(), f"/{first.slug}_{'9' * 65}/".encode()

    class Handler(DemoRequestHandler):
        def send_demo_response(self, response):
            body = response.body.replace(link, long_link)
            headers = {**response.headers, "Content-Length": str(len(body))}
            headers.pop("ETag", None)
            super().send_demo_response(DemoResponse(response.status, headers, body))

    with serving(DemoServer(("127.0.0.1", 0), Handler)) as server:
        result = materialize(instance, _on_postgres(tmp_path, postgres_url, base_url=server.base_url), ["travel"])
    assert result.success
    wh = Warehouse(postgres_url)
    assert sorted(r["product_id"] for r in wh.rows(products)) == sorted(str(p.id) for p in travel.products[1:])
    (letter,) = wh.rows(dead_letters)
    assert (letter["stage"], letter["category"]) == ("parse", "travel")
    assert letter["reason"].startswith("product_id: 65 characters in") and "at most 64" in letter["reason"]


def test_processes_creating_the_tables_at_once_all_succeed(postgres_url):
    """PostgreSQL's catalog refuses concurrent CREATE TABLEs of one name with a UniqueViolation
    (not "already exists"): the first runs of a backfill on a new warehouse would fail."""
    errors: list[BaseException] = []

    def create() -> None:
        try:
            Warehouse(postgres_url).create_tables()
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert Warehouse(postgres_url, create=False).existing_tables() == {
        "products", "dead_letters", "price_history", "partition_loads", "warehouse_site"}


def test_two_loads_of_one_category_at_once_wait_for_each_other(postgres_url):
    """Two delete-then-insert transactions of one category (a re-parse beside the daily run's
    load; on S3 no file lock keeps them apart) both started under READ COMMITTED: without a
    lock each deleted only the rows committed before it began, so ``dead_letters`` held every
    row twice and one of two ``products`` loads failed on the primary key. Here the table is
    locked until both are waiting, so they overlap every time."""
    import time as _time
    from decimal import Decimal

    import sqlalchemy as sa

    def product(pid: str, snapshot: str) -> dict:
        return {"category": "c", "product_id": pid, "title": f"T{pid}", "price": Decimal("9.99"), "currency": "GBP",
                "rating": 3, "availability": "In stock", "url": f"http://x/{pid}", "page_number": 1,
                "snapshot_id": snapshot, "fetched_at": "2026-12-07T08:00:00Z"}

    def letter(i: int, snapshot: str) -> dict:
        return {"category": "c", "url": f"http://x/p{i}", "stage": "fetch", "reason": "http_503", "http_status": 503,
                "attempts": 3, "snapshot_id": snapshot, "recorded_at": "2026-12-07T08:00:00Z"}

    def load(wh: Warehouse, table: sa.Table, snapshot: str) -> None:
        if table is products:
            wh.load_products("c", [product(str(i), snapshot) for i in range(50)], input_version=f"v{snapshot}",
                             snapshot_id=snapshot, loaded_at="2026-12-07T08:00:00Z", history_date="2026-12-07",
                             history_snapshot_id=snapshot)
        else:
            wh.replace_partition(dead_letters, "c", [letter(i, snapshot) for i in range(50)])

    first = Warehouse(postgres_url)
    errors: list[BaseException] = []

    def run(wh: Warehouse, table: sa.Table, snapshot: str) -> None:
        try:
            load(wh, table, snapshot)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    waiting = sa.text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                      "AND datname = current_database()")
    for table in (products, dead_letters):
        load(first, table, "s0")
        loaders = [Warehouse(postgres_url) for _ in range(2)]  # two processes' (their tables made before the lock)
        for wh in loaders:
            wh.create_tables()
        with first.engine.connect() as blocker:
            blocker.execute(sa.text(f"LOCK TABLE {table.name} IN SHARE MODE"))
            threads = [threading.Thread(target=run, args=(wh, table, snapshot))
                       for wh, snapshot in zip(loaders, ("s1", "s2"))]
            for thread in threads:
                thread.start()
            deadline = _time.monotonic() + 30
            with first.engine.connect() as probe:
                while probe.execute(waiting).scalar_one() < 2 and _time.monotonic() < deadline:
                    _time.sleep(0.05)
                assert probe.execute(waiting).scalar_one() >= 2  # both loads wait: they overlap
            blocker.rollback()
        for thread in threads:
            thread.join()
        assert errors == [], table.name
        assert first.count(table, "c") == 50, table.name
        assert len({r["snapshot_id"] for r in first.rows(table, "c")}) == 1, table.name
    assert first.duplicate_product_keys() == []


def test_a_password_in_the_urls_query_is_in_no_event_nor_message(tmp_path, instance, postgres_url):
    """libpq takes ``?password=`` as the password; the run's metadata, events and errors show ``***``.

    (The test server trusts its socket's users, so the password is accepted and unused.)
    """
    url = f"{postgres_url}&password=SECRET-PW"
    result = materialize(instance, _on_postgres(tmp_path, url), ["travel"])
    assert result.success
    shown = run_metadata(result)["products_table"]["warehouse"]
    assert shown.startswith("postgresql+psycopg://postgres@/t_") and shown.endswith("&password=***")
    logged = [str(record) for record in instance.all_logs(result.run_id)]
    assert logged and not [line for line in logged if "SECRET-PW" in line]
    wh = Warehouse(url.replace("/t_", "/no_such_db_"))  # the server refuses it: the error names the URL
    with pytest.raises(Exception) as refused:
        wh.existing_tables()
    message = wh.unreadable(refused.value)
    assert "no_such_db_" in message and "SECRET-PW" not in message


def _readme_storage_block() -> dict:
    """The README's ``storage:`` block for a shared Dagster instance on PostgreSQL."""
    import re

    import yaml

    from scrape_assets_tests.conftest import REPO_ROOT

    [block] = re.findall(r"```yaml\n(storage:\n  postgres:\n.*?)```", (REPO_ROOT / "README.md").read_text(), re.S)
    return yaml.safe_load(block)


@pytest.mark.parametrize("scheme", ["as the README gives it", "left out"])
def test_a_dagster_instance_on_postgresql_as_the_readme_configures_it(tmp_path, postgres_server, scheme):
    """The README's storage block (dagster-postgres) runs a materialization on a real
    PostgreSQL; without its ``scheme`` line, SQLAlchemy 2.1 drives a postgresql:// URL with
    psycopg 3, which refuses dagster-postgres's NOTIFY: the line is needed."""
    import dagster as dg
    import yaml

    from scrape_assets_tests.conftest import REPO_ROOT

    # The shipped instance settings (its instance class included) plus the README's block.
    config = {**yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text()), **_readme_storage_block()}
    db = config["storage"]["postgres"]["postgres_db"]
    assert db["scheme"] == "postgresql+psycopg2" and db["password"] == {"env": "DAGSTER_PG_PASSWORD"}
    name = f"d_{uuid.uuid4().hex[:12]}"
    postgres_server.psql(f"CREATE DATABASE {name};")
    # The test server: its socket folder (libpq's host), its superuser without a password.
    db.update(hostname="localhost", db_name=name, username="postgres", params={"host": str(postgres_server.pgdata)})
    del db["password"]
    if scheme == "left out":
        del db["scheme"]
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(config))

    @dg.asset
    def one() -> int:
        return 1

    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        if scheme == "left out":
            with pytest.raises(Exception, match=r"NOTIFY run_events, \$1"):
                dg.materialize([one], instance=instance)
            return
        result = dg.materialize([one], instance=instance)
        assert result.success
        [record] = instance.fetch_materializations(dg.AssetKey("one"), limit=10).records
        assert record.run_id == result.run_id


def test_a_user_who_may_not_create_the_tables_is_told_by_summary_and_by_the_first_run(tmp_path, instance, postgres_server,
                                                                                       postgres_url, monkeypatch):
    """PostgreSQL 15+ gives an ordinary user no CREATE on public: `scrape-assets summary` (the
    README's pre-flight) says the first run will fail, and the run fails once, saying what to grant."""
    import io

    from scrape_assets.cli import print_summary, summarize
    from scrape_assets.warehouse import CREATE_PRIVILEGE_HINT

    role = f"r_{uuid.uuid4().hex[:8]}"
    postgres_server.psql(f"CREATE ROLE {role} LOGIN;")
    url = postgres_url.replace("postgresql+psycopg://postgres@", f"postgresql+psycopg://{role}@")
    res = _on_postgres(tmp_path, url)
    summary = summarize(res)
    assert summary["warehouse_create_refused"] == f"user {role} may not create the tables in schema public ({CREATE_PRIVILEGE_HINT})"
    out = io.StringIO()
    print_summary(summary, out=out)
    assert f"  warehouse       the first run will fail: user {role} may not create the tables in schema public (" in out.getvalue()

    # scrape-assets demo's own check before it launches anything
    from scrape_assets.cli import preflight
    from scrape_assets.errors import SettingsError

    monkeypatch.setenv("SCRAPE_WAREHOUSE_URL", url)
    with pytest.raises(SettingsError, match=r"permission denied for schema public; the first run creates them: grant"):
        preflight(res)

    result = materialize(instance, res, ["travel"], selection=["raw_pages"], raise_on_error=False)
    assert not any(e.event_type_value == "STEP_UP_FOR_RETRY" for e in result.all_events)  # no retry can help
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    description = failure.step_failure_data.user_failure_data.description
    assert description.startswith(f"cannot create the warehouse's tables at postgresql+psycopg://{role}@/")
    assert description.endswith(f"ProgrammingError: permission denied for schema public ({CREATE_PRIVILEGE_HINT}); "
                                "nothing fetched")

    import sqlalchemy as sa

    owner = sa.create_engine(postgres_url)  # the database's owner grants it
    with owner.begin() as conn:
        conn.execute(sa.text(f"GRANT CREATE ON SCHEMA public TO {role}"))
    owner.dispose()
    assert "warehouse_create_refused" not in summarize(res)
    assert materialize(instance, res, ["travel"]).success
    assert "warehouse_create_refused" not in summarize(res)  # the tables exist
