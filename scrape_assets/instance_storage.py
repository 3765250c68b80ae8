"""Dagster's SQLite event log, with its database engines kept open between events.

Dagster's :class:`~dagster._core.storage.event_log.SqliteEventLogStorage` builds a new
SQLAlchemy engine (``NullPool``) for every event it stores and disposes of it afterwards:
about 4.7 ms of CPU per event here, before any row is written (``benchmarks/micro.py``,
"event log"). A scheduled run over 100 categories writes about 1,000 asset events (a
``MATERIALIZATION_PLANNED`` and an ``ASSET_MATERIALIZATION`` per asset and partition, the
check's results), so on an unchanged day that bookkeeping was most of the run.

:class:`PooledSqliteEventLogStorage` is the same storage (same files under
``$DAGSTER_HOME/history/runs/``, same schema, same lock around every use) with one change:
the engine of each shard (``index`` and one database per run) is kept, with its one pooled
connection, for the next event; ~1.2 ms per event instead. ``dagster.yaml`` selects it::

    event_log_storage:
      module: scrape_assets.instance_storage
      class: PooledSqliteEventLogStorage

Limits:

- At most :data:`MAX_ENGINES` shards keep an engine (least recently used is closed first),
  so a webserver that reads many runs' logs holds a bounded number of files open.
- A forked child never reuses its parent's connections (SQLite forbids carrying a
  connection across ``fork()``): the first use in a new process starts with no engines.
- Nothing changes for PostgreSQL (``storage: postgres:``), which pools on its own; remove
  the block above to go back to Dagster's default SQLite storage: the files are the same.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

from dagster import Field, StringSource
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.sql import create_engine
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS, create_db_conn_string
from dagster._serdes import ConfigurableClassData
from sqlalchemy.engine import Connection, Engine

#: Shards (``index`` plus run databases) whose engine stays open; a run writes to two.
MAX_ENGINES = 8


def default_base_dir() -> str:
    """Where Dagster's default SQLite storage keeps event logs: ``$DAGSTER_HOME/history/runs``.

    Raises:
        ValueError: ``DAGSTER_HOME`` is not set and no ``base_dir`` was configured.
    """
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        raise ValueError(
            "PooledSqliteEventLogStorage: set DAGSTER_HOME or give `base_dir` in the "
            "event_log_storage config (expected a folder for the run databases)"
        )
    return os.path.join(home, "history", "runs")


class PooledSqliteEventLogStorage(SqliteEventLogStorage):
    """SQLite event log storage that reuses one engine per shard (see the module docstring).

    Args:
        base_dir: folder of the run databases and ``index.db``; default
            ``$DAGSTER_HOME/history/runs`` (where Dagster's default storage keeps them).
        inst_data: set by Dagster when it builds the storage from ``dagster.yaml``.

    Raises:
        ValueError: neither ``base_dir`` nor ``DAGSTER_HOME`` is set.
    """

    def __init__(self, base_dir: str | None = None, inst_data: ConfigurableClassData | None = None):
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._engines_pid = os.getpid()
        super().__init__(base_dir or default_base_dir(), inst_data=inst_data)

    @classmethod
    def config_type(cls) -> dict:
        return {"base_dir": Field(StringSource, is_required=False)}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: dict):
        return cls(base_dir=config_value.get("base_dir"), inst_data=inst_data)

    @property
    def open_shards(self) -> list[str]:
        """Shards whose engine is open, least recently used first (for tests and debugging)."""
        return list(self._engines)

    def _engine(self, shard: str) -> Engine:
        """The shard's engine, created (and its database initialised) on first use. Lock held."""
        if self._engines_pid != os.getpid():
            # Inherited through fork(): the parent's connections belong to the parent.
            for engine in self._engines.values():
                engine.dispose(close=False)
            self._engines.clear()
            self._engines_pid = os.getpid()
        engine = self._engines.get(shard)
        if engine is not None:
            self._engines.move_to_end(shard)
            return engine
        # One connection stays pooled; a nested use (Dagster's schema set-up inspects the
        # database while connected) opens a second one and closes it when done.
        engine = create_engine(
            create_db_conn_string(self._base_dir, shard),
            pool_size=1,
            max_overflow=4,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS},
        )
        if shard not in self._initialized_dbs:
            self._initdb(engine)
            self._initialized_dbs.add(shard)
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

    def _close_engines(self) -> None:
        with self._db_lock:
            for engine in self._engines.values():
                engine.dispose()
            self._engines.clear()

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
