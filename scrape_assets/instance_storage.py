"""Dagster's SQLite event log, with its database engines kept open between events.

Dagster's :class:`~dagster._core.storage.event_log.SqliteEventLogStorage` builds a new
SQLAlchemy engine (``NullPool``) for every event it stores and disposes of it afterwards:
about 4 ms of CPU per event here, before any row is written (``benchmarks/micro.py``,
"event log"). A scheduled run over 100 categories writes about 1,000 asset events (a
``MATERIALIZATION_PLANNED`` and an ``ASSET_MATERIALIZATION`` per asset and partition, the
checks' results), so on an unchanged day that bookkeeping was most of the run.

:class:`PooledSqliteEventLogStorage` is the same storage (same files, same schema, same
lock around every use) with two changes:

- the engine of each shard (``index`` and one database per run) is kept, with its pooled
  connection, for the next event: ~1.3 ms per event instead;
- a *batch* of one run's asset events (the ~400 planned materializations of a
  100-partition run, a step's 100 partition materializations) is written in two
  transactions instead of two per event (:meth:`~PooledSqliteEventLogStorage.store_event_batch`;
  Dagster hands batches to a storage only when ``DAGSTER_EVENT_BATCH_SIZE`` > 0, which
  :class:`ScrapeInstance` makes its default): an unchanged 100-category day ~0.9 s faster.

:class:`ScrapeInstance` makes it the default of the instance's SQLite storage, under the
instance's own folder (``<instance>/history/runs/``, where Dagster keeps event logs), so
a temporary instance (``dagster dev`` without ``DAGSTER_HOME``) gets it too.
``dagster.yaml`` selects it::

    instance_class:
      module: scrape_assets.instance_storage
      class: ScrapeInstance

Limits:

- At most :data:`MAX_ENGINES` shards keep an engine (least recently used is closed first),
  so a webserver that reads many runs' logs holds a bounded number of files open.
- Each use of a run database ends with a passive checkpoint into its ``.db`` file, which
  the UI's live log view watches (the stock storage got one when the last connection
  closed; see :func:`_checkpoint_on_checkin`). ``index.db`` keeps SQLite's default
  checkpoint every ~1,000 pages, so its write-ahead log file stays around. A reader from
  outside these storages (an ``sqlite3`` shell) that holds a read open while a run commits
  its last event delays that event in the live view until the page is reloaded.
- ``dagster run wipe`` closes this process's engines before the files are deleted; a
  webserver or daemon running at the same time keeps reading the deleted files until it
  is restarted (stop them before wiping).
- A forked child never reuses its parent's connections (SQLite forbids carrying a
  connection across ``fork()``): the first use in a new process starts with no engines.
- Batched events reach the databases together when the batch ends (Dagster buffers them
  for the few milliseconds it takes to emit them). ``DAGSTER_EVENT_BATCH_SIZE=0`` stores
  every event on its own, as stock Dagster does. ``index.db`` gets a batch whole or not at
  all; if its write fails (say, locked beyond the busy timeout), Dagster stores the batch
  again one event at a time and the run's own log shows those events twice. A process
  killed between the two writes leaves the batch in the run's log only (stock Dagster has
  the same window for each event).
- Only the SQLite default changes: a ``storage:`` block (``postgres:``, which pools on its
  own) still wins, with Dagster's own batching default. Removing ``instance_class`` goes
  back to Dagster's stock classes on the same files, without losing history.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext

import yaml
from dagster import DagsterInstance, StringSource
from dagster._core.errors import DagsterInvariantViolationError
from dagster._core.events import ASSET_EVENTS, DagsterEventType
from dagster._core.events.log import EventLogEntry
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage.event_log.sqlite.sqlite_event_log import INDEX_SHARD_NAME, SqliteEventLogStorage
from dagster._core.storage.sqlalchemy_compat import db_result
from dagster._core.storage.sql import create_engine
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS, create_db_conn_string
from dagster._serdes import ConfigurableClassData
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from scrape_assets.errors import SettingsError

logger = logging.getLogger(__name__)

#: Shards (``index`` plus run databases) whose engine stays open; a run writes to two.
MAX_ENGINES = 8
#: Most events Dagster buffers for one batch write (a 100-partition run plans ~400 at once).
EVENT_BATCH_SIZE = 1000


def _checkpoint_on_checkin(dbapi_connection, _record) -> None:
    """Copy committed WAL frames into the run's ``.db`` whenever a connection is given back.

    Dagster's UI follows a running run through a file watch on ``<run_id>.db``. The stock
    storage touched that file when the last connection closed (SQLite checkpoints then);
    pooled connections never close, so each use ends with a passive checkpoint instead,
    by writers and readers alike: a commit that a reader's open snapshot kept out of the
    file is copied when that reader is done. Best effort: a connection SQLAlchemy has
    invalidated is skipped, and an SQLite error here never fails the event's own write
    (the next use checkpoints again).
    """
    if dbapi_connection is None:
        return
    try:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        cursor.close()
    except sqlite3.Error as exc:
        logger.debug("event log checkpoint skipped: %s", exc)


class PooledSqliteEventLogStorage(SqliteEventLogStorage):
    """SQLite event log storage that reuses one engine per shard (see the module docstring).

    Args:
        base_dir: folder of the run databases and ``index.db``.
        inst_data: set by Dagster when it builds the storage from the instance config.
    """

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._engines_pid = os.getpid()
        self._batch_index: tuple[Connection, int] | None = None  # (connection, thread) of a batch being written
        self._tables_seen: set[str] = set()
        super().__init__(base_dir, inst_data=inst_data)

    @classmethod
    def config_type(cls) -> dict:
        return {"base_dir": StringSource}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: dict):
        return cls(base_dir=config_value["base_dir"], inst_data=inst_data)

    @property
    def open_shards(self) -> list[str]:
        """Shards whose engine is open, least recently used first (for tests and debugging)."""
        return list(self._engines)

    def _forget_inherited_engines(self) -> None:
        """After fork(): drop the parent's engines without closing its connections."""
        if self._engines_pid != os.getpid():
            for engine in self._engines.values():
                engine.dispose(close=False)
            self._engines.clear()
            self._batch_index = None
            self._engines_pid = os.getpid()

    def _engine(self, shard: str) -> Engine:
        """The shard's engine, created (and its database initialised) on first use. Lock held."""
        self._forget_inherited_engines()
        engine = self._engines.get(shard)
        if engine is not None:
            self._engines.move_to_end(shard)
            return engine
        # One connection stays pooled; a nested use (Dagster's schema set-up inspects the
        # database while connected) opens another one and closes it when done.
        engine = create_engine(
            create_db_conn_string(self._base_dir, shard),
            pool_size=1,
            max_overflow=4,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS},
        )
        if shard != INDEX_SHARD_NAME:
            event.listen(engine, "checkin", _checkpoint_on_checkin)
        try:
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
        except BaseException:
            engine.dispose()
            raise
        self._engines[shard] = engine
        while len(self._engines) > MAX_ENGINES:
            _, oldest = self._engines.popitem(last=False)
            oldest.dispose()
        return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        # Same contract as the parent's: the storage lock is held for the whole use, so one
        # pooled connection per shard is enough and no two threads share it at once.
        with self._db_lock:
            with self._engine(shard).connect() as conn:
                with conn.begin():
                    yield conn

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        """Store a batch of one run's events: the rows :meth:`store_event` writes, in two transactions.

        Dagster hands over a batch (with batch writing on, see :class:`ScrapeInstance`) for
        the planned materializations and checks of a run, and for the per-partition
        materializations of a step. Written in Dagster's own order, run first:

        1. the run's database, one transaction: every event's row, in the batch's order;
        2. ``index.db``, one transaction: per event in order, its row and what
           :meth:`store_event` adds for it (the asset entry, or the planned check's rows,
           through Dagster's own code), then the asset tags of all its events in one
           ``INSERT`` (the same rows and ids as one event at a time).

        A batch of several runs, or with an event type Dagster does not batch, goes through
        :meth:`store_event` one event at a time. ``index.db`` (what sensors, asset pages and
        ``raw_pages``' adoption read) gets a batch whole or not at all: when step 2 fails,
        Dagster stores the batch again one event at a time, so the run's log shows those
        events twice, the index once.
        """
        kinds = {event.dagster_event_type for event in events if event.is_dagster_event}
        if (
            not events
            or len({event.run_id for event in events}) != 1
            or not all(event.is_dagster_event for event in events)
            or not kinds <= ASSET_EVENTS | {DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED}
        ):
            super().store_event_batch(events)
            return
        statements = [self.prepare_insert_event(event) for event in events]
        with self.run_connection(events[0].run_id) as conn:
            for statement in statements:
                conn.execute(statement)
        with self.index_transaction() as conn:
            self._batch_index = (conn, threading.get_ident())  # Dagster's check code asks index_connection()
            try:
                asset_events, asset_event_ids = [], []
                for event, statement in zip(events, statements):
                    with db_result(conn, statement) as result:
                        event_id = result.inserted_primary_key[0]
                    if event.dagster_event_type == DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED:
                        self.store_asset_check_event(event, event_id)
                        continue
                    if event_id is None:
                        raise DagsterInvariantViolationError("Cannot store asset event tags for null event id.")
                    self._store_asset_event(conn, event, event_id)
                    asset_events.append(event)
                    asset_event_ids.append(event_id)
                self._store_asset_event_tags(conn, asset_events, asset_event_ids)  # one INSERT for the batch
            finally:
                self._batch_index = None

    def has_table(self, table_name: str) -> bool:
        """Whether ``index.db`` has the table; a table once seen is remembered (until wipe/upgrade).

        Dagster asks before writing each event's asset tags and each asset check event,
        and answers with a new SQLAlchemy engine each time. Dagster's own code never drops
        an event-log table (only an alembic ``downgrade`` or a manual ``DROP TABLE`` does;
        restart the processes using the instance after one), so a positive answer stays true.
        """
        if table_name in self._tables_seen:
            return True
        present = super().has_table(table_name)
        if present:
            self._tables_seen.add(table_name)
        return present

    def index_connection(self):
        # Inside store_event_batch, on its thread (which holds the storage lock): the batch's own
        # transaction. A second connection there would wait on the batch's write lock. Other
        # threads take the usual path and wait for the lock.
        batch = self._batch_index
        if batch is not None and batch[1] == threading.get_ident():
            return nullcontext(batch[0])
        return super().index_connection()

    def _close_engines(self) -> None:
        """Close this process's engines and forget the tables seen (before files change or go)."""
        with self._db_lock:
            self._forget_inherited_engines()
            for engine in self._engines.values():
                engine.dispose()
            self._engines.clear()
            self._tables_seen.clear()

    def wipe(self) -> None:
        # The parent deletes the shard files: close them first, never write to unlinked files.
        self._close_engines()
        super().wipe()

    def upgrade(self) -> None:
        self._close_engines()
        super().upgrade()

    def dispose(self) -> None:
        self._close_engines()
        super().dispose()


def _class_data(module: str, name: str, config: Mapping) -> ConfigurableClassData:
    return ConfigurableClassData(module, name, yaml.dump(dict(config), default_flow_style=False))


def configured_event_batch_size(env: Mapping[str, str] | None = None) -> int | None:
    """Dagster's ``DAGSTER_EVENT_BATCH_SIZE`` (events per batch, ``0``: each on its own), None when unset.

    Checked when the definitions load and by the ``scrape-assets`` commands, before a run is
    created: the instance reads it only once a run executes, which would leave a run that
    never starts.

    Raises:
        SettingsError: it is not an integer >= 0 (Dagster's own check would fail with a bare
            ``ValueError``).
    """
    configured = (os.environ if env is None else env).get("DAGSTER_EVENT_BATCH_SIZE")
    if configured is None:
        return None
    try:
        size = int(configured)
    except ValueError:
        size = -1
    if size < 0:
        raise SettingsError("DAGSTER_EVENT_BATCH_SIZE", configured, "an integer >= 0 (0: every event on its own)")
    return size


class ScrapeInstance(DagsterInstance):
    """A :class:`~dagster.DagsterInstance` whose default SQLite storage uses
    :class:`PooledSqliteEventLogStorage`, with Dagster's event batching on for it (see the
    module docstring). Nothing else differs.
    """

    @classmethod
    def config_schema(cls) -> dict:
        return {}

    def _get_event_batch_size(self) -> int:
        """Dagster's ``DAGSTER_EVENT_BATCH_SIZE`` when set; else :data:`EVENT_BATCH_SIZE` on the pooled log.

        Dagster buffers a batch of events (see :meth:`PooledSqliteEventLogStorage.store_event_batch`)
        only when this is above 0; its own default is 0 (its SQLite storage would store them one by
        one anyway). Another event log storage (a ``storage:`` block) keeps Dagster's default.

        Raises:
            SettingsError: ``DAGSTER_EVENT_BATCH_SIZE`` is not an integer >= 0 (Dagster's own
                check would fail with a bare ``ValueError``).
        """
        size = configured_event_batch_size()
        if size is not None:
            return size
        return EVENT_BATCH_SIZE if isinstance(self.event_log_storage, PooledSqliteEventLogStorage) else 0

    @staticmethod
    def config_defaults(base_dir: str) -> Mapping[str, ConfigurableClassData | None]:
        """Dagster's defaults for an instance in ``base_dir``, with the pooled event log."""
        defaults = dict(InstanceRef.config_defaults(base_dir))
        event_log = _class_data(__name__, PooledSqliteEventLogStorage.__name__,
                                {"base_dir": os.path.join(base_dir, "history", "runs", "")})
        parts = {"run_storage": defaults["run_storage"], "event_log_storage": event_log,
                 "schedule_storage": defaults["schedule_storage"]}
        defaults["event_log_storage"] = event_log
        defaults["storage"] = _class_data("dagster._core.storage.legacy_storage", "CompositeStorage", {
            name: {"module_name": d.module_name, "class_name": d.class_name, "config_yaml": d.config_yaml}
            for name, d in parts.items()
        })
        return defaults
