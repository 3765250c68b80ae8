"""The warehouse: ``products``, ``dead_letters``, ``price_history`` and ``partition_loads``.

Tables are loaded idempotently per partition.

Any SQLAlchemy URL works (``sqlite:///data/warehouse.db`` by default, PostgreSQL in
production). A partition is loaded by delete-then-insert inside one transaction, so a
rerun gives the same table and a failed load leaves the previous rows in place.
SQLite connections use WAL and a busy timeout so runs of different categories can load
in parallel without "database is locked".
"""

from __future__ import annotations

import functools
import operator
import os
import random
import sqlite3
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import sqlalchemy as sa

from scrape_assets.crashpoints import crashpoint
from scrape_assets.errors import SettingsError
from scrape_assets.limits import MAX_PRODUCT_ID_CHARS, PRICE_PRECISION, PRICE_SCALE
from scrape_assets.manifest import utc_now_iso
from scrape_assets.storage import redact_url

metadata = sa.MetaData()

products = sa.Table(
    "products",
    metadata,
    sa.Column("category", sa.String(64), primary_key=True),
    sa.Column("product_id", sa.String(MAX_PRODUCT_ID_CHARS), primary_key=True),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("price", sa.Numeric(PRICE_PRECISION, PRICE_SCALE), nullable=False, comment="in units of `currency`"),
    sa.Column("currency", sa.String(3), nullable=False, comment="ISO 4217"),
    sa.Column("rating", sa.SmallInteger, nullable=False, comment="1..5 stars"),
    sa.Column("availability", sa.Text, nullable=False),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("page_number", sa.Integer, nullable=False, comment="1-based listing page"),
    sa.Column("snapshot_id", sa.String(64), nullable=False),
    sa.Column("fetched_at", sa.String(32), nullable=False, comment="UTC ISO 8601"),
)

dead_letters = sa.Table(
    "dead_letters",
    metadata,
    sa.Column("category", sa.String(64), nullable=False, index=True),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("stage", sa.String(16), nullable=False, comment="fetch | parse"),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("http_status", sa.Integer, nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("snapshot_id", sa.String(64), nullable=False),
    sa.Column("recorded_at", sa.String(32), nullable=False, comment="UTC ISO 8601"),
)

price_history = sa.Table(
    "price_history",
    metadata,
    sa.Column("snapshot_date", sa.String(10), primary_key=True, comment="UTC date of the snapshot, YYYY-MM-DD"),
    sa.Column("category", sa.String(64), primary_key=True),
    sa.Column("product_id", sa.String(MAX_PRODUCT_ID_CHARS), primary_key=True),
    sa.Column("price", sa.Numeric(PRICE_PRECISION, PRICE_SCALE), nullable=False, comment="in units of `currency`"),
    sa.Column("currency", sa.String(3), nullable=False, comment="ISO 4217"),
    sa.Column("snapshot_id", sa.String(64), nullable=False, comment="the latest snapshot of that day"),
)

partition_loads = sa.Table(
    "partition_loads",
    metadata,
    sa.Column("table_name", sa.String(64), primary_key=True),
    sa.Column("category", sa.String(64), primary_key=True),
    sa.Column("input_version", sa.String(128), nullable=False, comment="what the loaded rows were parsed from"),
    sa.Column("snapshot_id", sa.String(64), nullable=False),
    sa.Column("loaded_at", sa.String(32), nullable=False, comment="UTC ISO 8601"),
)

warehouse_site = sa.Table(
    "warehouse_site",
    metadata,
    # One row at most (id = 1): a second claim, of any site, is a key conflict.
    sa.Column("id", sa.SmallInteger, sa.CheckConstraint("id = 1", name="one_site_per_warehouse"), primary_key=True,
              autoincrement=False),
    sa.Column("site", sa.String(64), nullable=False, comment="the one site whose rows these tables hold"),
    sa.Column("claimed_at", sa.String(32), nullable=False, comment="UTC ISO 8601"),
)

SQLITE_BUSY_TIMEOUT_MS = 30_000


#: PostgreSQL advisory lock key (any bigint) held while creating the tables.
_DDL_LOCK_KEY = 0x5C7A9E_7AB1E5
#: First key of the PostgreSQL advisory locks held per (table, category) while a partition is
#: replaced (two int4 keys: a key space apart from the single-bigint one above).
_PARTITION_LOCK_SPACE = 0x5C7A9E


def _lock_partition(conn: sa.Connection, table: sa.Table, category: str) -> None:
    """Make concurrent replacements of one partition of ``table`` wait for each other.

    PostgreSQL: a transaction-scoped advisory lock (``pg_advisory_xact_lock``) on ``(table,
    category)``, taken as the transaction's first statement and released at its end. Under
    READ COMMITTED two delete-then-insert transactions of one category would otherwise both
    delete the rows committed before either began, then both insert: ``dead_letters`` held
    every row twice, and one of two ``products`` loads failed on the primary key. Nothing
    else keeps two loads of a category apart when raw pages are on S3 (the per-partition
    file locks hold for a local storage root only). SQLite: nothing to do, a transaction that
    writes holds the database's single write lock.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:space, hashtext(:key))"),
                     {"space": _PARTITION_LOCK_SPACE, "key": f"{table.name}/{category}"})


def _sqlite_path_problem(file: Path | None) -> str | None:
    """Why a SQLite database at ``file`` (``None``: in memory) cannot be the warehouse, or ``None``.

    A database in memory is gone when its step's process ends (each step, the summary and
    the next run are other processes); a relative file depends on each process's current
    folder (the CLI's, the UI's code server's, a run worker's), which need not be the same.
    """
    absolute = "sqlite:////absolute/path/warehouse.db (four slashes), or a server's URL such as postgresql://..."
    if file is None:
        return f"a database file that outlives the process: {absolute}; an in-memory database keeps nothing"
    if not file.is_absolute():  # "~" too: SQLite does not expand it
        return (f"an absolute path: {absolute} (this one is {Path(file).absolute()} from this process's folder; the "
                "UI's code server and run workers may start in another)")
    return None


#: What installs the database drivers this project documents, by the module a URL's driver imports.
_DRIVER_HINTS = {
    "psycopg": " (pip install -e '.[postgres]')",
    "psycopg2": (" (postgresql+psycopg2:// needs psycopg2: pip install -e '.[dagster-postgres]' brings it; or write "
                 "postgresql:// for psycopg 3, from pip install -e '.[postgres]')"),
}


class Warehouse:
    """A SQLAlchemy engine plus the per-partition load operations.

    Args:
        url: SQLAlchemy URL. Credentials in it never reach logs (see :meth:`describe`).
        create: False for a reader that must not write (``scrape-assets summary``): missing
            tables are never created, so reading one raises ``sqlalchemy.exc.SQLAlchemyError``
            (``OperationalError`` on SQLite; check :meth:`existing_tables` first), and a
            SQLite file keeps its journal mode (only the busy timeout is set). A SQLite file
            in a folder this process may not write (a read-only mount, another user's data
            folder) is read as immutable when the file holds every commit and no
            connection has it open: no ``-shm``, no ``-wal`` with content, no ``-journal``
            beside it (SQLite could not create the ``-shm`` file a WAL reader needs there).
            Otherwise it is opened as usual, and a read SQLite cannot do fails as
            :meth:`unreadable` says. Limit: in another user's folder, that user's pipeline
            starting to write during the read is not seen, and may make the read fail.

    Raises:
        SettingsError: the URL cannot be parsed or its driver is not installed.
    """

    def __init__(self, url: str, *, create: bool = True):
        self.url = url
        _check_user_info(url)
        try:
            self.engine = sa.create_engine(url)
        except ImportError as exc:  # a valid URL whose database driver is not installed
            hint = _DRIVER_HINTS.get(getattr(exc, "name", None) or "", "")
            raise SettingsError("SCRAPE_WAREHOUSE_URL", shown_url(sa.engine.make_url(url)),
                                f"a SQLAlchemy URL whose driver is installed in this environment ({exc}){hint}") from exc
        except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError) as exc:
            raise SettingsError("SCRAPE_WAREHOUSE_URL", redact_url(url), f"a SQLAlchemy URL ({exc})") from exc
        except ValueError as exc:  # a port that is not a number, or a query value the driver refuses
            try:
                shown = shown_url(sa.engine.make_url(url))
            except ValueError:  # the port: its text may be the rest of a password, so nothing of it is shown
                raise SettingsError("SCRAPE_WAREHOUSE_URL", redact_url(url),
                                    "a SQLAlchemy URL whose port, if any, is a number") from None
            raise SettingsError("SCRAPE_WAREHOUSE_URL", shown,
                                f"a SQLAlchemy URL whose query values its driver accepts ({exc})") from None
        if self.engine.dialect.name == "sqlite":
            file = self._sqlite_file()
            if problem := _sqlite_path_problem(file):
                raise SettingsError("SCRAPE_WAREHOUSE_URL", redact_url(url), problem)
            if not create and file is not None and _unwritable_and_unused(file):
                # Same URL (describe() shows it); connections opened as immutable (SQLite URI parameter).
                self.engine = sa.create_engine(url, creator=functools.partial(_connect_immutable, file))
            sa.event.listen(self.engine, "connect", _sqlite_pragmas if create else _sqlite_reader_pragmas)
        self._created = not create

    def close(self) -> None:
        """Close the engine's pooled connections (SQLite: the last one folds the WAL into the file).

        Steps close their warehouse when done, so a run leaves ``warehouse.db`` whole (no
        ``-wal`` file holding its last writes) whatever the interpreter does at exit.
        The object stays usable: a later call opens a new connection.
        """
        self.engine.dispose()

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def accepts_decimal_strings(self) -> bool:
        """Whether :meth:`load_products` may get prices as exact decimal strings (``"51.77"``).

        SQLite: yes, its ``Numeric`` binding turns the string into the same float as the
        Decimal. Other databases get Decimals (a driver may send a string as text).
        """
        return self.engine.dialect.name == "sqlite"

    def describe(self) -> str:
        """The URL without its password, for logs and metadata (see :func:`shown_url`)."""
        return shown_url(self.engine.url)

    def unreadable(self, exc: Exception) -> str:
        """One line for a database error met using this warehouse (down, locked, not a database, other tables).

        ``cannot use the warehouse at <url> (SCRAPE_WAREHOUSE_URL): <error class>: <the
        driver's first line>``; the SQL statement SQLAlchemy appends is left out. A refused
        ``CREATE`` (PostgreSQL's "permission denied for schema") reads ``cannot create the
        warehouse's tables at ...`` with what to grant.
        """
        error = database_error(exc)
        if create_refused_in(error):
            return (f"cannot create the warehouse's tables at {self.describe()} (SCRAPE_WAREHOUSE_URL): {error} "
                    f"({CREATE_PRIVILEGE_HINT})")
        return f"cannot use the warehouse at {self.describe()} (SCRAPE_WAREHOUSE_URL): {error}"

    def create_refused(self) -> str | None:
        """Why the first load could not create the tables, checked without creating anything;
        None when it could, when they all exist, or on SQLite (checked as it opens the file).

        PostgreSQL only: the connection's user needs ``CREATE`` on the first schema of its
        ``search_path`` (``has_schema_privilege``); since PostgreSQL 15 an ordinary user has
        none on ``public``.
        """
        if self.engine.dialect.name != "postgresql" or self.existing_tables() == set(metadata.tables):
            return None
        query = sa.text("SELECT current_user, current_schema(), "
                        "current_schema() IS NOT NULL AND has_schema_privilege(current_schema(), 'CREATE')")
        with self.engine.connect() as conn:
            user, schema, allowed = conn.execute(query).one()
        if schema is None:
            return f"no schema of user {user}'s search_path exists to create the tables in ({CREATE_PRIVILEGE_HINT})"
        return None if allowed else f"user {user} may not create the tables in schema {schema} ({CREATE_PRIVILEGE_HINT})"

    def _sqlite_file(self) -> Path | None:
        """The SQLite database file (None: not SQLite, or in memory).

        A URI filename (``sqlite:///file:/abs/w.db?mode=ro&uri=true``) names its file in
        the URI's path, percent-decoded.
        """
        database = self.engine.url.database
        if self.engine.dialect.name != "sqlite" or not database or database == ":memory:":
            return None
        return Path(unquote(urlsplit(database).path)) if database.startswith("file:") else Path(database)

    def existing_tables(self) -> set[str]:
        """Names of this project's tables that exist, found without creating anything (not even a SQLite file)."""
        file = self._sqlite_file()
        if file is not None and not file.exists():
            return set()  # connecting would create the file
        return set(sa.inspect(self.engine).get_table_names()) & set(metadata.tables)

    def create_tables(self) -> None:
        """Create the tables if missing (idempotent, and safe when several processes race to do it).

        A warehouse made with ``create=False`` creates nothing: reading a missing table raises.
        """
        if not self._created and self.engine.dialect.name == "postgresql":
            # Concurrent CREATE TABLEs collide in PostgreSQL's catalog (a UniqueViolation on
            # pg_type, not "already exists"): one process at a time, holding a transaction-level
            # advisory lock; DDL is transactional there, so the others then find the tables.
            with self.engine.begin() as conn:
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _DDL_LOCK_KEY})
                metadata.create_all(conn)
            self._created = True
        if not self._created:
            if (file := self._sqlite_file()) is not None:
                file.parent.mkdir(parents=True, exist_ok=True)
            # create_all checks, then creates: another process may create a table (or the index)
            # in between. Each such collision means one more object exists, so one attempt per
            # object, plus one, always ends (six processes racing needed more than three).
            attempts = len(metadata.tables) + sum(len(t.indexes) for t in metadata.tables.values()) + 1
            for attempt in range(attempts):
                try:
                    metadata.create_all(self.engine)
                    break
                except (sa.exc.OperationalError, sa.exc.ProgrammingError) as exc:
                    if "already exists" not in str(exc) or attempt == attempts - 1:
                        raise
            self._created = True

    def replace_partition(self, table: sa.Table, category: str, rows: Iterable[Mapping]) -> int:
        """Delete the partition's rows and insert ``rows``, in one transaction (concurrent
        replacements of one partition wait for each other, see :func:`_lock_partition`).

        Returns:
            Rows inserted.

        Raises:
            sqlalchemy.exc.IntegrityError: duplicate keys in ``rows`` (nothing is changed).
        """
        self.create_tables()
        rows = list(rows)
        with self.engine.begin() as conn:
            _lock_partition(conn, table, category)
            conn.execute(table.delete().where(table.c.category == category))
            crashpoint("warehouse.after_delete")
            insert_many(conn, table, rows)
            crashpoint("warehouse.after_insert")
        return len(rows)

    def site(self) -> str | None:
        """The site these tables belong to (None: not claimed yet)."""
        self.create_tables()
        with self.engine.connect() as conn:
            return conn.execute(sa.select(warehouse_site.c.site).where(warehouse_site.c.id == 1)).scalar_one_or_none()

    def check_site(self, site: str, *, owns: Callable[[str, str], bool] | None = None) -> None:
        """Raise if these tables belong to another site, or have another shape (reads only).

        Every column of every table is selected (no row), so a ``products`` table that
        someone else made fails here, before a crawl, as the load would fail after it.

        Args:
            owns: as for :meth:`claim_site`, which a load step calls with the same: tables
                loaded before claims existed are refused here as it would refuse them.

        Raises:
            SettingsError: the tables belong to another site (see :meth:`claim_site`).
            sqlalchemy.exc.SQLAlchemyError: a table lacks a column ("no such column"), or the
                database cannot be read (:func:`may_recover` tells which may pass).
        """
        owner = self.site()
        if owner not in (None, site):
            raise self._other_site(site, owner)
        if owner is None and owns is not None:
            self._check_unclaimed_loads(site, owns, now=utc_now_iso())
        with self.engine.connect() as conn:
            for table in metadata.tables.values():
                conn.execute(sa.select(*table.c).limit(0)).all()

    def claim_site(self, site: str, *, now: str, owns: Callable[[str, str], bool] | None = None) -> None:
        """Make sure these tables hold ``site``'s rows only; the first site to load claims them.

        The tables are keyed by category, not by site: a second site's ``travel`` would
        replace the first's rows (or have them carried into its own). Call before loading.

        Args:
            owns: ``(category, snapshot_id) -> bool``, whether a load recorded in
                ``partition_loads`` is ``site``'s (its manifest is in this site's storage).
                Tables loaded before claims existed are claimed only if one of their loads
                is ``site``'s (or none was recorded); None: no such check.

        Raises:
            SettingsError: the tables belong to another site, or hold loads none of which is
                ``site``'s (names the site, and the SQL to claim them by hand if they are).
        """
        owner = self.site()
        if owner is None:
            if owns is not None:
                self._check_unclaimed_loads(site, owns, now=now)
            try:
                with self.engine.begin() as conn:
                    conn.execute(warehouse_site.insert(), [{"id": 1, "site": site, "claimed_at": now}])
                return
            except sa.exc.IntegrityError:  # another process claimed it first: check whom for
                owner = self.site()
        if owner != site:
            raise self._other_site(site, owner)

    def _check_unclaimed_loads(self, site: str, owns: Callable[[str, str], bool], *, now: str) -> None:
        """Raise when tables loaded before claims existed hold loads none of which is ``site``'s."""
        with self.engine.connect() as conn:
            loads = conn.execute(sa.select(partition_loads.c.category, partition_loads.c.snapshot_id)).all()
        if loads and not any(owns(category, snapshot) for category, snapshot in loads):
            raise SettingsError(
                "SCRAPE_WAREHOUSE_URL", self.describe(),
                f"a warehouse of site {site!r} (this one was loaded before sites were recorded, and none of "
                f"its {len(loads)} loads is a snapshot of {site!r}; if it is this site's, claim it with "
                f"INSERT INTO warehouse_site (id, site, claimed_at) VALUES (1, '{site}', '{now}'))",
            )

    def _other_site(self, site: str, owner: str | None) -> SettingsError:
        return SettingsError(
            "SCRAPE_WAREHOUSE_URL", self.describe(),
            f"the warehouse of site {site!r} (this one holds site {owner!r}; its tables are keyed by category: "
            "give each site its own warehouse, with SCRAPE_DATA_DIR or SCRAPE_WAREHOUSE_URL)",
        )

    def loaded_versions(self, table: sa.Table, categories: Collection[str]) -> dict[str, str]:
        """``{category: input version}`` last loaded into ``table``, for those of ``categories`` ever loaded."""
        self.create_tables()
        query = sa.select(partition_loads.c.category, partition_loads.c.input_version).where(
            partition_loads.c.table_name == table.name
        )
        with self.engine.connect() as conn:
            return {
                category: version for where in _each_chunk(partition_loads.c.category, categories)
                for category, version in conn.execute(query.where(where))
            }

    def loaded_since(self, table: sa.Table, categories: Collection[str], since: str) -> set[str]:
        """Those of ``categories`` whose last load into ``table`` was committed at ``since`` or later.

        Args:
            since: a UTC time as ``partition_loads.loaded_at`` holds it (ISO 8601 with
                seconds and ``Z``, :func:`~scrape_assets.manifest.utc_now_iso`); a load in
                the same second counts.
        """
        self.create_tables()
        query = sa.select(partition_loads.c.category).where(
            partition_loads.c.table_name == table.name, partition_loads.c.loaded_at >= since
        )
        with self.engine.connect() as conn:
            return {category for where in _each_chunk(partition_loads.c.category, categories)
                    for (category,) in conn.execute(query.where(where))}

    def load_products(
        self,
        category: str,
        rows: list[Mapping] | None,
        *,
        input_version: str,
        snapshot_id: str,
        loaded_at: str,
        history_date: str,
        history_snapshot_id: str,
        carry_unseen: bool = False,
        carry_ids: Collection[str] = (),
    ) -> tuple[int, int]:
        """Load one partition of ``products`` and its day's prices in ``price_history``, in one
        transaction; concurrent loads of one category wait for each other (:func:`_lock_partition`).

        Args:
            rows: the partition's product rows (a mapping per row with at least the table's
                columns; other keys are ignored; ``price`` a Decimal, or its exact string
                when :attr:`accepts_decimal_strings`), or None to leave ``products`` as it is
                (unchanged input: only the price history of the day is written).
            carry_unseen: True when the snapshot could not see every page (one failed, or was
                never reached) or every product (its pages disagree on the listing's size:
                it changed while they were fetched): every row loaded earlier whose product is not among ``rows``
                is kept (carried forward with its older ``snapshot_id``), whatever page it
                was on. A listing re-sorts from day to day, so a product last seen on a page
                fetched now may be on the page that failed; only a snapshot that saw every
                page drops a product. A failed fetch never deletes good rows. Rows of
                ``snapshot_id`` itself are never carried: loading it again (re-parsed with
                new rules) replaces them, as its pages were all read again.
            carry_ids: product ids whose cards the snapshot rejected (a field that no longer
                parses): their rows loaded earlier are kept the same way, even when the
                snapshot saw every page. The product is still listed; its card is a dead
                letter until a snapshot reads it again.
            input_version: recorded in ``partition_loads`` to recognise an unchanged input.
            history_date: ``YYYY-MM-DD``; ``price_history`` gets that day's row of every product
                *seen* in the loaded snapshot (its ``snapshot_id`` is the one recorded in
                ``partition_loads``), replacing the day's earlier row of the same product, so
                re-running a day never duplicates. Carried-forward rows were not seen: their old
                prices are not stamped with this day, and a row an earlier run of the same day
                saw stays. When ``rows`` are given, the day's rows an earlier load of this same
                ``history_snapshot_id`` wrote for products these rows no longer have are
                deleted (a re-parse of the snapshot with new rules: an id read differently, a
                card now rejected), so the day holds what the loaded rows say.

        Returns:
            ``(rows inserted, rows carried forward)``; ``(0, 0)`` when ``rows`` is None.
        """
        self.create_tables()
        with self.engine.begin() as conn:
            _lock_partition(conn, products, category)  # before the rows to carry are read
            inserted = carried = 0
            if rows is not None:
                rows = list(rows)
                kept = []
                if carry_unseen or carry_ids:  # rows are read back only then (usually no page or card failed)
                    fresh = {r["product_id"] for r in rows}
                    carry_ids = set(carry_ids)
                    query = sa.select(products).where(products.c.category == category)
                    # Not rows of this very snapshot: a re-parse of it (new rules) saw those pages anew.
                    kept = [dict(r._mapping) for r in conn.execute(query)
                            if r.product_id not in fresh and r.snapshot_id != snapshot_id
                            and (carry_unseen or r.product_id in carry_ids)]
                conn.execute(products.delete().where(products.c.category == category))
                crashpoint("warehouse.after_delete")
                insert_many(conn, products, rows + kept)
                carried = len(kept)
                crashpoint("warehouse.after_insert")
                inserted = len(rows)
                conn.execute(
                    partition_loads.delete().where(
                        partition_loads.c.table_name == products.name, partition_loads.c.category == category
                    )
                )
                conn.execute(
                    partition_loads.insert(),
                    [{"table_name": products.name, "category": category, "input_version": input_version,
                      "snapshot_id": snapshot_id, "loaded_at": loaded_at}],
                )
            # Seen in the loaded snapshot: carried rows keep an older snapshot_id, so their
            # (old) prices are not stamped with this day.
            loaded_snapshot = (
                sa.select(partition_loads.c.snapshot_id)
                .where(partition_loads.c.table_name == products.name, partition_loads.c.category == category)
                .scalar_subquery()
            )
            seen = sa.and_(products.c.category == category, products.c.snapshot_id == loaded_snapshot)
            if rows is not None:  # what an earlier load of this snapshot stamped on the day and these rows lack
                conn.execute(price_history.delete().where(
                    price_history.c.snapshot_date == history_date,
                    price_history.c.category == category,
                    price_history.c.snapshot_id == history_snapshot_id,
                    ~sa.exists().where(seen, products.c.product_id == price_history.c.product_id),
                ))
            write_price_history(conn, category, history_date, history_snapshot_id, seen)
        return inserted, carried

    def count(self, table: sa.Table, category: str | None = None) -> int:
        """Rows in ``table`` (of one category when given)."""
        self.create_tables()
        query = sa.select(sa.func.count()).select_from(table)
        if category is not None:
            query = query.where(table.c.category == category)
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def rows_by_category(self, table: sa.Table, categories: Collection[str] | None = None) -> dict[str, int]:
        """``{category: rows}`` of ``table`` (only ``categories`` when given); a category without rows is left out.

        Ordered by category as the database sorts them (its collation), within each
        :data:`_IN_CHUNK` of ``categories``.
        """
        self.create_tables()
        query = sa.select(table.c.category, sa.func.count()).group_by(table.c.category).order_by(table.c.category)
        with self.engine.connect() as conn:
            return {
                category: int(n) for where in _each_chunk(table.c.category, categories)
                for category, n in conn.execute(query.where(where))
            }

    def rows_of_loaded_snapshots(self, categories: Collection[str]) -> dict[str, int]:
        """``{category: rows}`` of ``products`` from the snapshot last loaded into it (the
        ``snapshot_id`` in ``partition_loads``): the rows that load inserted, unless something
        outside the pipeline changed them since (carried-forward rows have older ids). A
        category without such rows is left out."""
        self.create_tables()
        loads = partition_loads
        query = (
            sa.select(products.c.category, sa.func.count())
            .join(loads, sa.and_(loads.c.table_name == products.name, loads.c.category == products.c.category,
                                 loads.c.snapshot_id == products.c.snapshot_id))
            .group_by(products.c.category)
        )
        with self.engine.connect() as conn:
            return {
                category: int(n) for where in _each_chunk(products.c.category, categories)
                for category, n in conn.execute(query.where(where))
            }

    def carried_forward(self) -> dict[str, tuple[int, str]]:
        """``{category: (rows, oldest fetched_at)}`` of the ``products`` rows not seen in the
        snapshot last loaded for their category (carried forward from pages that failed since,
        or for cards rejected since: see :meth:`load_products`); categories with none are left
        out. Reads only: a warehouse without ``partition_loads`` (older than it) has none to tell.
        """
        p, loads = products, partition_loads
        query = (
            sa.select(p.c.category, sa.func.count(), sa.func.min(p.c.fetched_at))
            .select_from(p.join(loads, sa.and_(loads.c.table_name == p.name, loads.c.category == p.c.category)))
            .where(p.c.snapshot_id != loads.c.snapshot_id)
            .group_by(p.c.category)
            .order_by(p.c.category)
        )
        with self.engine.connect() as conn:
            return {category: (int(n), oldest) for category, n, oldest in conn.execute(query)}

    def duplicate_product_keys(self, categories: Collection[str] | None = None) -> list[tuple[str, str, int]]:
        """``(category, product_id, count)`` for keys that appear more than once (should be none).

        Args:
            categories: look only at these categories (all when None).
        """
        self.create_tables()
        query = (
            sa.select(products.c.category, products.c.product_id, sa.func.count().label("n"))
            .group_by(products.c.category, products.c.product_id)
            .having(sa.func.count() > 1)
        )
        with self.engine.connect() as conn:
            return [tuple(r) for where in _each_chunk(products.c.category, categories) for r in conn.execute(query.where(where))]

    def rows(self, table: sa.Table, category: str | None = None) -> list[dict]:
        """All rows of ``table`` as dicts, ordered by its columns (for tests and summaries)."""
        self.create_tables()
        query = sa.select(table).order_by(*table.c)
        if category is not None:
            query = query.where(table.c.category == category)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]


#: Query parameters whose values logs, metadata and errors may show: libpq's connection
#: target and TLS mode, which say which server failed (``?host=`` is how several hosts or a
#: Unix socket are given). Every other value is hidden.
_SHOWN_QUERY_KEYS = frozenset({"host", "hostaddr", "port", "sslmode", "connect_timeout", "application_name",
                               "target_session_attrs"})


def shown_url(url: sa.URL) -> str:
    """``url`` as logs, metadata and errors may show it: no password, no secret query values.

    The password is ``***``; so is the value of every query parameter other than
    :data:`_SHOWN_QUERY_KEYS` (``?password=...`` is a password to libpq and psycopg, and a
    driver may take other secrets there: ``sslpassword``), except SQLite's; the
    parameters' names stay, to say what was set.
    """
    if not url.query or url.get_backend_name() == "sqlite":
        return url.render_as_string(hide_password=True)
    shown = url.set(query={k: v for k, v in url.query.items() if k in _SHOWN_QUERY_KEYS})
    rendered = shown.render_as_string(hide_password=True)
    hidden = "&".join(f"{name}=***" for name in sorted(url.query) if name not in _SHOWN_QUERY_KEYS)
    return f"{rendered}{'&' if shown.query else '?'}{hidden}" if hidden else rendered


def _check_user_info(url: str) -> None:
    """Refuse a URL whose password holds an unencoded ``@`` (nothing of it shown).

    SQLAlchemy takes the password up to the first ``@`` after the user name:
    ``postgresql://scraper:Pa55@word@db.internal/shop`` would have the password "Pa55" and
    the host "word@db.internal", which a driver error would then print. So the check is on
    the host SQLAlchemy parsed (an ``@`` in a user name, ``user@server:pw@host``, parses
    right and passes), or, after a password, on a second ``@`` after the one ending it. RFC
    3986 section 3.2.1: user info is percent-encoded. A URL
    SQLAlchemy cannot parse is left to :class:`Warehouse`, which shows none of it.

    Raises:
        SettingsError: naming ``SCRAPE_WAREHOUSE_URL``.
    """
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError):
        return
    # SQLAlchemy ends the password at its first "@" (the user name, "user@server" on Azure, may
    # hold one): another "@" after that one means the password held an "@" and then a "/",
    # "?" or "#" (postgresql://alice:p@ss/word@db/shop: host "ss", database "word@db/shop").
    # An "@" in a query value is refused with it: encoded as %40, it passes.
    rest = url.partition("://")[2]
    user_end, slash = rest.find(":"), rest.find("/")
    password_end = rest.find("@", user_end) if user_end >= 0 and (slash < 0 or user_end < slash) else -1
    misread = parsed.password is not None and password_end >= 0 and "@" in rest[password_end + 1:]
    if "@" in (parsed.host or "") or misread:
        scheme = url.partition("://")[0]
        raise SettingsError(
            "SCRAPE_WAREHOUSE_URL", f"{scheme}://<hidden>",
            "a URL whose user name and password are percent-encoded ('@' as %40, ':' as %3A, '/' as %2F, '?' "
            "as %3F; an '@' elsewhere in the URL as %40), "
            "or the password left out of the URL and set in PGPASSWORD (PostgreSQL)",
        )


#: What to do when the database user may not create the warehouse's tables (README, Configuration).
CREATE_PRIVILEGE_HINT = ("the first run creates them: grant the user CREATE on the schema, or point the URL at a "
                         "schema it owns (?options=-csearch_path%3Dscrape), or create them once as their owner; "
                         "since PostgreSQL 15 an ordinary user has no CREATE on public")


def create_refused_in(error: str) -> bool:
    """Whether ``error`` (:func:`database_error`'s line) is PostgreSQL refusing to create a
    table in a schema (SQLSTATE 42501, "permission denied for schema ...")."""
    return "permission denied for schema" in error


def database_error(exc: Exception) -> str:
    """The driver's own first line of a SQLAlchemy error (``OperationalError: connection refused ...``), without the SQL."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines() or [""]
    return f"{exc.__class__.__name__}: {lines[0]}"


#: SQLite result codes (https://sqlite.org/rescode.html) of a database that may be usable again
#: soon: BUSY, LOCKED, IOERR, FULL, CANTOPEN (a folder, a mount not there yet), PROTOCOL.
_SQLITE_TRANSIENT = {5, 6, 10, 13, 14, 15}
#: SQLSTATE classes (PostgreSQL Appendix A) of a server that may accept the same statement
#: later: 08 connection exception, 40 transaction rollback (serialization, deadlock), 53
#: insufficient resources, 57 operator intervention (shutting down, starting up), 58 system error.
_SQLSTATE_TRANSIENT = {"08", "40", "53", "57", "58"}
#: Single SQLSTATEs of other classes that may pass: 55P03 lock_not_available (a table another
#: writer holds locked past the session's ``lock_timeout``, PostgreSQL's "database is locked").
_SQLSTATE_TRANSIENT_CODES = {"55P03"}


def may_recover(exc: Exception) -> bool:
    """Whether a SQLAlchemy error may go away if the same work is tried again later.

    True for a lost connection, a database that is locked, busy, unreachable or out of
    space (SQLite's result code, PostgreSQL's SQLSTATE class: see :data:`_SQLITE_TRANSIENT`,
    :data:`_SQLSTATE_TRANSIENT` and :data:`_SQLSTATE_TRANSIENT_CODES`), and for an
    ``OperationalError`` or ``InterfaceError`` whose driver gives no code (psycopg's "connection refused"). False for what the same
    database will answer again: tables of another shape ("no such column"), a file that is
    not a database, a login or a database name the server refuses (SQLSTATE 28, 3D).

    Where the driver gives no code, the message decides (:data:`_PERMANENT_MESSAGES`):
    psycopg and psycopg2 raise a failed connection (a refused password, an unknown
    database) with no SQLSTATE, and ``sqlite3`` before Python 3.11 has no result codes.
    """
    if getattr(exc, "connection_invalidated", False):
        return True
    cause = getattr(exc, "orig", None)
    sqlite_code = getattr(cause, "sqlite_errorcode", None)  # Python >= 3.11
    if sqlite_code is not None:
        return sqlite_code & 0xFF in _SQLITE_TRANSIENT  # the primary code of an extended one
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)  # psycopg 3, psycopg2
    if sqlstate is None and cause is not None and cause.args and isinstance(cause.args[0], dict):
        sqlstate = cause.args[0].get("C")  # pg8000: the server's error fields
    if isinstance(sqlstate, str) and len(sqlstate) == 5:
        return sqlstate[:2] in _SQLSTATE_TRANSIENT or sqlstate in _SQLSTATE_TRANSIENT_CODES
    message = str(cause if cause is not None else exc).lower()
    if any(text in message for text in _PERMANENT_MESSAGES):
        return False
    return isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError))


#: Messages of errors no retry fixes, for drivers that give no code: libpq's for a refused
#: login or an unknown database or role (psycopg, psycopg2 at connect time) and SQLite's
#: (``sqlite3`` before Python 3.11).
_PERMANENT_MESSAGES = (
    "password authentication failed", "no password supplied", "no pg_hba.conf entry",
    "does not exist",  # database "shop" / role "scraper" does not exist
    "no such table", "no such column", "file is not a database", "has no column named",
)


#: Values per ``IN (...)`` list: SQLite before 3.32 allows 999 bound variables per statement.
_IN_CHUNK = 500


def _each_chunk(column: sa.ColumnElement, values: Collection[str] | None) -> Iterator[sa.ColumnElement[bool]]:
    """WHERE clauses that together select ``column IN values`` (everything when ``values`` is None)."""
    if isinstance(values, str):
        raise TypeError(f"expected a collection of categories, got the string {values!r}")
    if values is None:
        yield sa.true()
        return
    values = sorted(set(values))
    for start in range(0, len(values), _IN_CHUNK):
        yield column.in_(values[start : start + _IN_CHUNK])


_HISTORY_COLUMNS = ["snapshot_date", "category", "product_id", "price", "currency", "snapshot_id"]


def write_price_history(
    conn: sa.Connection, category: str, history_date: str, history_snapshot_id: str, seen: sa.ColumnElement[bool],
    *, upsert: bool | None = None,
) -> None:
    """Give every product of ``category`` matching ``seen`` its ``price_history`` row of ``history_date``.

    The day's earlier row of the same product (a re-run of the day) is replaced; other
    rows are left alone. On SQLite >= 3.24 one ``INSERT ... SELECT ... ON CONFLICT DO UPDATE``
    (an upsert) does it in one pass: re-running a day of 100 categories of 2,000 products
    rewrites the 200,000 rows ~2.5x faster than deleting and inserting them. Elsewhere
    (``upsert=False``, the default for other databases and older SQLite) the day's rows of
    those products are deleted and inserted again; in the caller's transaction either way.
    """
    select = sa.select(
        sa.literal(history_date), products.c.category, products.c.product_id, products.c.price,
        products.c.currency, sa.literal(history_snapshot_id),
    ).where(seen)  # a WHERE clause, which SQLite needs to tell an upsert's ON from a join's
    if upsert is None:  # the upsert needs SQLite >= 3.24 (2018); an older library gets delete + insert
        upsert = conn.dialect.name == "sqlite" and conn.dialect.dbapi.sqlite_version_info >= (3, 24, 0)
    if upsert:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        statement = sqlite_insert(price_history).from_select(_HISTORY_COLUMNS, select)
        conn.execute(statement.on_conflict_do_update(
            index_elements=[price_history.c.snapshot_date, price_history.c.category, price_history.c.product_id],
            set_={name: statement.excluded[name] for name in ("price", "currency", "snapshot_id")},
        ))
        return
    conn.execute(
        price_history.delete().where(
            price_history.c.snapshot_date == history_date,
            price_history.c.category == category,
            price_history.c.product_id.in_(sa.select(products.c.product_id).where(seen)),
        )
    )
    conn.execute(price_history.insert().from_select(_HISTORY_COLUMNS, select))


def insert_many(conn: sa.Connection, table: sa.Table, rows: list[Mapping]) -> None:
    """``INSERT`` ``rows`` into ``table`` (nothing when empty); the same rows as Core's insert.

    On SQLite (qmark paramstyle, the default) the rows go to ``sqlite3``'s ``executemany``
    (a loop in C) through :meth:`sqlalchemy.engine.Connection.exec_driver_sql`: the statement
    is compiled once, each column's bind processor (``Decimal`` -> ``float`` for ``price``)
    is applied here, and SQLAlchemy's per-row parameter processing is skipped (200,000
    product rows: ~1.1 s -> ~0.5 s on the benchmark machine). Other databases get
    ``conn.execute(table.insert(), rows)``: their SQLAlchemy dialects batch an executemany
    into multi-row ``VALUES`` statements, which the driver's own ``executemany`` would not
    (psycopg2 sends one statement per row).

    Args:
        rows: one mapping per row with every column of ``table``; other keys are ignored.

    Raises:
        KeyError: a row lacks one of the table's columns (nothing is inserted).
        sqlalchemy.exc.IntegrityError: a duplicate key (the transaction is left to roll back).
    """
    if not rows:
        return
    dialect = conn.dialect
    names = [column.name for column in table.columns]
    # A tuple in column order (KeyError names a missing column); itemgetter of one name gives a bare value.
    values = operator.itemgetter(*names) if len(names) > 1 else lambda row: (row[names[0]],)
    if dialect.name != "sqlite" or not dialect.positional:
        conn.execute(table.insert(), [dict(zip(names, values(row))) for row in rows])
        return
    binds = [(i, column.type.dialect_impl(dialect).bind_processor(dialect)) for i, column in enumerate(table.columns)]
    binds = [(i, bind) for i, bind in binds if bind is not None]
    params = list(map(values, rows))
    if binds:  # column by column (map and zip loop in C): ~3x less Python per row than row by row
        columns = list(zip(*params))
        for i, bind in binds:
            columns[i] = map(bind, columns[i])
        params = list(zip(*columns))
    conn.exec_driver_sql(str(table.insert().compile(dialect=dialect)), params)


def _folder_writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK)


def _unwritable_and_unused(file: Path) -> bool:
    """Whether ``file`` exists in a folder this process may not write and holds every commit, unused.

    No ``-shm`` file: no connection has the database open (the last one to close removes
    it), and a WAL reader could not create it (https://sqlite.org/wal.html#readonly). No
    ``-wal`` file with content: no commit waits outside the file, which an immutable read
    would miss (a copy taken without its ``-shm``). No ``-journal``: no interrupted
    rollback-journal transaction, whose half-written pages an immutable read would see.
    """
    def present(suffix: str) -> bool:
        side = Path(f"{file}{suffix}")
        return side.exists() and (suffix != "-wal" or side.stat().st_size > 0)

    return file.is_file() and not _folder_writable(file.parent) and not any(map(present, ("-shm", "-wal", "-journal")))


def _connect_immutable(file: Path) -> sqlite3.Connection:
    """A connection reading ``file`` as immutable: no lock, no ``-shm`` or ``-wal`` file (https://sqlite.org/uri.html)."""
    return sqlite3.connect(f"file:{quote(str(file.resolve()))}?immutable=1", uri=True, check_same_thread=False)


def _sqlite_reader_pragmas(dbapi_connection, _record) -> None:
    """A reader's connection: wait for writers, change nothing in the file (not even its journal mode)."""
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.close()


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    """A writer's connection: busy timeout, WAL (switched once per file), ``synchronous=NORMAL``."""
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        _switch_to_wal(cursor)
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _switch_to_wal(cursor: sqlite3.Cursor) -> None:
    """``PRAGMA journal_mode=WAL``, retried while another connection holds the file's write lock.

    The switch reads the file, then upgrades to a write lock; SQLite refuses that upgrade
    at once ("database is locked", SQLITE_BUSY) while another connection writes, without
    calling the busy handler (https://sqlite.org/c3ref/busy_handler.html: it would
    deadlock), so the busy timeout does not cover it. Several processes opening a new
    warehouse at once meet this. Retried with a short growing sleep for up to
    SQLITE_BUSY_TIMEOUT_MS; then the last error is raised.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    delay_s = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() + delay_s > deadline:
                raise
            time.sleep(delay_s * random.uniform(0.5, 1.0))
            delay_s = min(delay_s * 2, 0.25)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused for a lock another connection holds (SQLITE_BUSY, https://sqlite.org/rescode.html#busy).

    Its extended codes count (the primary code is the low byte). An error sqlite3 did not
    raise carries no result code: the message decides ("database is locked"; SQLITE_LOCKED
    reads "database table is locked").
    """
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF == 5 if code is not None else "database is locked" in str(exc)
