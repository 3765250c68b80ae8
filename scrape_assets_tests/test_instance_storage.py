"""PooledSqliteEventLogStorage: same files and records as Dagster's SQLite event log, engines reused."""

from __future__ import annotations

import multiprocessing
import shutil
import sqlite3
import subprocess
import sys
import time

import dagster as dg
import pytest
from dagster._core.events import StepMaterializationData
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

from scrape_assets.errors import SettingsError
from scrape_assets.instance_storage import MAX_ENGINES, PooledSqliteEventLogStorage, ScrapeInstance
from scrape_assets_tests.conftest import REPO_ROOT

ASSET = dg.AssetKey("raw_pages")


def _materialization(run_id: str, partition: str) -> dg.EventLogEntry:
    event = dg.DagsterEvent(
        event_type_value=dg.DagsterEventType.ASSET_MATERIALIZATION.value,
        job_name="job",
        event_specific_data=StepMaterializationData(
            dg.AssetMaterialization(asset_key=ASSET, partition=partition, metadata={"pages": 3})
        ),
    )
    return dg.EventLogEntry(error_info=None, level=20, user_message="", run_id=run_id, timestamp=time.time(),
                         step_key="raw_pages", job_name="job", dagster_event=event)


def _partitions(storage, run_id: str) -> list[str]:
    records = storage.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
    return [r.event_log_entry.dagster_event.partition for r in records]


def test_stock_storage_reads_what_the_pooled_one_wrote_and_engines_are_reused(tmp_path):
    pooled = PooledSqliteEventLogStorage(str(tmp_path))
    for i in range(5):
        pooled.store_event(_materialization("run-a", f"cat-{i}"))
    assert pooled.open_shards == ["run-a", "index"]
    engine = pooled._engines["run-a"]
    pooled.store_event(_materialization("run-a", "cat-5"))
    assert pooled._engines["run-a"] is engine  # not rebuilt per event

    stock = SqliteEventLogStorage(str(tmp_path))
    assert _partitions(stock, "run-a") == [f"cat-{i}" for i in range(6)]
    # The cross-run index (what the UI's asset pages read) has them too.
    assert stock.get_latest_materialization_events([ASSET])[ASSET].dagster_event.partition == "cat-5"
    pooled.dispose()
    assert pooled.open_shards == []


def test_at_most_max_engines_stay_open_and_evicted_runs_stay_readable(tmp_path):
    pooled = PooledSqliteEventLogStorage(str(tmp_path))
    runs = [f"run-{i}" for i in range(MAX_ENGINES + 3)]
    for run_id in runs:
        pooled.store_event(_materialization(run_id, "cat-0"))
    assert len(pooled.open_shards) == MAX_ENGINES
    assert pooled.open_shards[-1] == "index"
    assert "run-0" not in pooled.open_shards
    pooled.store_event(_materialization("run-0", "cat-1"))  # reopened after eviction
    assert _partitions(pooled, "run-0") == ["cat-0", "cat-1"]
    assert _partitions(SqliteEventLogStorage(str(tmp_path)), "run-0") == ["cat-0", "cat-1"]


def _store_in_child(storage: PooledSqliteEventLogStorage, queue) -> None:
    inherited = dict(storage._engines)
    storage.store_event(_materialization("run-a", "from-child"))
    queue.put([storage._engines[shard] is not engine for shard, engine in inherited.items()])


def test_a_forked_child_opens_its_own_connections(tmp_path):
    pooled = PooledSqliteEventLogStorage(str(tmp_path))
    pooled.store_event(_materialization("run-a", "from-parent"))
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_store_in_child, args=(pooled, queue))
    child.start()
    fresh = queue.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0
    assert fresh == [True, True]  # neither shard's engine came from the parent
    pooled.store_event(_materialization("run-a", "parent-again"))  # the parent's still work
    assert _partitions(pooled, "run-a") == ["from-parent", "from-child", "parent-again"]


def test_wipe_closes_the_files_it_deletes(tmp_path):
    pooled = PooledSqliteEventLogStorage(str(tmp_path))
    pooled.store_event(_materialization("run-a", "before"))
    pooled.wipe()
    pooled.store_event(_materialization("run-a", "after"))
    # Written to the new file, not to the unlinked one an open connection would still hold.
    assert _partitions(SqliteEventLogStorage(str(tmp_path)), "run-a") == ["after"]


def test_the_ui_live_log_watch_sees_every_event_of_a_running_run(tmp_path):
    """Dagster's UI follows a run through a file watch on its ``.db``: each commit must reach it."""
    writer, reader = PooledSqliteEventLogStorage(str(tmp_path)), PooledSqliteEventLogStorage(str(tmp_path))
    writer.store_event(_materialization("run-a", "cat-0"))
    seen = []
    reader.watch("run-a", None, lambda entry, cursor: seen.append(entry.dagster_event.partition))
    try:
        time.sleep(0.5)  # the watch is registered
        for i in range(1, 4):
            writer.store_event(_materialization("run-a", f"cat-{i}"))
            time.sleep(0.2)
        deadline = time.monotonic() + 10
        while seen[-1:] != ["cat-3"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen[-1:] == ["cat-3"]  # a connection kept open must not hide commits from it
    finally:
        reader.dispose()


_WRITER = """
import sys
from scrape_assets.instance_storage import PooledSqliteEventLogStorage
from scrape_assets_tests.test_instance_storage import _materialization
writer = PooledSqliteEventLogStorage(sys.argv[1])
for partition in sys.argv[2:]:
    writer.store_event(_materialization("run-a", partition))
writer.dispose()
"""


def _write_in_another_process(base_dir, *partitions: str) -> None:
    subprocess.run([sys.executable, "-c", _WRITER, str(base_dir), *partitions], cwd=REPO_ROOT, check=True)


def test_the_live_log_watch_sees_a_last_event_committed_during_a_read(tmp_path):
    """The webserver reads a run (its own pooled connection) while the run worker, another
    process, commits its last event: the watch must still see it once the read is done."""
    from sqlalchemy import text

    _write_in_another_process(tmp_path, "c0", "c1", "c2")  # rows enough for a read to stay open
    webserver = PooledSqliteEventLogStorage(str(tmp_path))
    seen = []
    webserver.watch("run-a", None, lambda entry, cursor: seen.append(entry.dagster_event.partition))
    try:
        time.sleep(0.5)  # the watch is registered
        with webserver.run_connection("run-a") as conn:
            reading = conn.execute(text("SELECT id FROM event_logs"))
            reading.fetchone()  # a read snapshot is open while the last event is committed
            _write_in_another_process(tmp_path, "last")
            reading.close()
        deadline = time.monotonic() + 10
        while seen[-1:] != ["last"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen == ["c0", "c1", "c2", "last"]
    finally:
        webserver.dispose()


@dg.asset(partitions_def=dg.StaticPartitionsDefinition(["a", "b"]))
def tiny(context) -> None:
    context.log.info(f"partition {context.partition_key}")


def test_the_shipped_dagster_yaml_selects_it_and_runs_record_as_usual(tmp_path, monkeypatch):
    shutil.copy(REPO_ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with dg.DagsterInstance.get() as instance:
        assert isinstance(instance, ScrapeInstance)
        assert isinstance(instance.event_log_storage, PooledSqliteEventLogStorage)
        assert instance.event_log_storage._base_dir == str(tmp_path / "history" / "runs")  # Dagster's own place
        for key in ("a", "b"):
            assert dg.materialize([tiny], instance=instance, partition_key=key).success
        status = instance.get_status_by_partition(dg.AssetKey("tiny"), ["a", "b"], tiny.partitions_def)
        assert {k: v.value for k, v in status.items()} == {"a": "MATERIALIZED", "b": "MATERIALIZED"}
    # Without the instance_class lines: the stock classes read the same runs.
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with dg.DagsterInstance.get() as stock:
        assert type(stock.event_log_storage) is SqliteEventLogStorage
        event = stock.get_latest_materialization_event(dg.AssetKey("tiny"))
        assert event.dagster_event.partition == "b"


def test_a_temporary_instance_keeps_its_event_log_in_its_own_folder(tmp_path, monkeypatch):
    """``dagster dev`` without DAGSTER_HOME: a temporary folder, dagster.yaml from the project."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    config_dir = tmp_path / "project"
    config_dir.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", config_dir / "dagster.yaml")
    ref = InstanceRef.from_dir(str(tmp_path / "tmp_home"), config_dir=str(config_dir))
    with dg.DagsterInstance.from_ref(ref) as instance:
        assert isinstance(instance.event_log_storage, PooledSqliteEventLogStorage)
        assert instance.event_log_storage._base_dir == str(tmp_path / "tmp_home" / "history" / "runs")
        assert dg.materialize([tiny], instance=instance, partition_key="a").success


def test_a_storage_block_still_wins(tmp_path, monkeypatch):
    (tmp_path / "dagster.yaml").write_text(
        (REPO_ROOT / "dagster.yaml").read_text() + f"storage:\n  sqlite:\n    base_dir: {tmp_path / 'elsewhere'}\n"
    )
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with dg.DagsterInstance.get() as instance:
        assert type(instance.event_log_storage) is SqliteEventLogStorage


def test_a_failed_checkpoint_never_fails_the_write():
    from scrape_assets.instance_storage import _checkpoint_on_checkin

    class Closed:
        def cursor(self):
            raise sqlite3.ProgrammingError("Cannot operate on a closed database.")

    _checkpoint_on_checkin(None, None)  # an invalidated connection: nothing to do
    _checkpoint_on_checkin(Closed(), None)  # logged at debug, not raised


@dg.asset(
    partitions_def=dg.StaticPartitionsDefinition(["a", "b", "c"]),
    backfill_policy=dg.BackfillPolicy.single_run(),
    check_specs=[dg.AssetCheckSpec("rows_ok", asset="ranged")],
)
def ranged(context) -> dg.MaterializeResult:
    return dg.MaterializeResult(
        metadata={"partitions": len(context.partition_keys)},
        data_version=dg.DataVersion("v1"),
        check_results=[dg.AssetCheckResult(passed=True)],
    )


_RANGE_TAGS = {"dagster/asset_partition_range_start": "a", "dagster/asset_partition_range_end": "c"}


def _run_ranged(tmp_path, monkeypatch) -> tuple[str, list[list[dg.EventLogEntry]]]:
    """Materialize ``ranged`` over a, b, c in one run on a ScrapeInstance; the batches its storage got."""
    batches: list[list[dg.EventLogEntry]] = []
    original = PooledSqliteEventLogStorage.store_event_batch

    def spy(self, events):
        batches.append(list(events))
        original(self, events)

    tmp_path.mkdir(exist_ok=True)
    shutil.copy(REPO_ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    with monkeypatch.context() as patched:
        patched.setattr(PooledSqliteEventLogStorage, "store_event_batch", spy)
        patched.setenv("DAGSTER_HOME", str(tmp_path))
        with dg.DagsterInstance.get() as instance:
            result = dg.materialize([ranged], instance=instance, tags=_RANGE_TAGS)
            assert result.success
            status = instance.get_status_by_partition(dg.AssetKey("ranged"), ["a", "b", "c"], ranged.partitions_def)
            assert {k: v.value for k, v in status.items()} == {"a": "MATERIALIZED", "b": "MATERIALIZED",
                                                               "c": "MATERIALIZED"}
    return result.run_id, batches


def test_a_run_writes_its_planned_events_and_partition_materializations_in_batches(tmp_path, monkeypatch):
    monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE", raising=False)
    _, batches = _run_ranged(tmp_path, monkeypatch)
    kinds = [sorted(e.dagster_event_type.value for e in batch) for batch in batches]
    assert kinds == [
        ["ASSET_CHECK_EVALUATION_PLANNED"] + ["ASSET_MATERIALIZATION_PLANNED"] * 3,  # at run creation
        ["ASSET_MATERIALIZATION"] * 3,  # the step's three partitions
    ]


def test_dagster_event_batch_size_0_stores_events_one_by_one(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "0")
    _, batches = _run_ranged(tmp_path, monkeypatch)
    assert batches == []


@pytest.mark.parametrize("value", ["off", "-1"])
def test_a_bad_dagster_event_batch_size_names_the_variable(tmp_path, monkeypatch, value):
    shutil.copy(REPO_ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", value)
    with dg.DagsterInstance.get() as instance:
        with pytest.raises(SettingsError, match=rf"DAGSTER_EVENT_BATCH_SIZE='{value}' is invalid: expected an integer >= 0"):
            instance._get_event_batch_size()


def test_a_storage_block_keeps_dagsters_batching_default(tmp_path, monkeypatch):
    (tmp_path / "dagster.yaml").write_text(
        (REPO_ROOT / "dagster.yaml").read_text() + f"storage:\n  sqlite:\n    base_dir: {tmp_path / 'elsewhere'}\n"
    )
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE", raising=False)
    with dg.DagsterInstance.get() as instance:
        assert instance._get_event_batch_size() == 0


def test_a_batch_stores_what_storing_its_events_one_by_one_stores(tmp_path, monkeypatch):
    """Replay a real run's batches into two fresh logs, batched and one by one: same reads everywhere."""
    monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE", raising=False)
    run_id, batches = _run_ranged(tmp_path / "run", monkeypatch)
    one_by_one = PooledSqliteEventLogStorage(str(tmp_path / "one_by_one"))
    batched = PooledSqliteEventLogStorage(str(tmp_path / "batched"))
    for batch in batches:
        for event in batch:
            one_by_one.store_event(event)
        batched.store_event_batch(batch)
    key, check_key = dg.AssetKey("ranged"), dg.AssetCheckKey(dg.AssetKey("ranged"), "rows_ok")

    def reads(storage) -> dict:
        def entries(event_type):
            records = storage.fetch_materializations(key, limit=10).records if event_type is None else \
                storage.get_event_records(dg.EventRecordsFilter(event_type=event_type, asset_key=key))
            return [r.event_log_entry for r in records]

        asset_entry = storage.get_asset_records([key])[0].asset_entry
        return {
            "run log": [r.event_log_entry for r in storage.get_records_for_run(run_id).records],
            "materializations": entries(None),
            "planned": entries(dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED),
            "latest": asset_entry.last_materialization_record.event_log_entry,
            "materialized partitions": storage.get_materialized_partitions(key),
            "data version tags": sorted(map(sorted, (t.items() for t in storage.get_event_tags_for_asset(key)))),
            "planned check": [(r.status, r.partition) for r in storage.get_asset_check_execution_history(check_key, 10)],
        }

    expected = reads(one_by_one)
    assert expected["materialized partitions"] == {"a", "b", "c"} and len(expected["planned"]) == 3
    assert expected["data version tags"] and expected["planned check"]
    assert reads(batched) == expected


def test_a_batch_is_one_transaction_per_database(tmp_path, monkeypatch):
    """The fast path really runs: one use of the run's database and one of index.db per batch."""
    monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE", raising=False)
    run_id, batches = _run_ranged(tmp_path / "run", monkeypatch)
    storage = PooledSqliteEventLogStorage(str(tmp_path / "replay"))
    uses: list[str] = []
    original = PooledSqliteEventLogStorage._connect
    monkeypatch.setattr(PooledSqliteEventLogStorage, "_connect", lambda self, shard: uses.append(shard) or original(self, shard))
    for batch in batches:
        uses.clear()
        storage.store_event_batch(batch)
        assert uses == [run_id, "index"], [e.dagster_event_type for e in batch]


def test_a_failed_index_write_leaves_the_index_untouched_and_dagster_stores_the_batch_again(tmp_path, monkeypatch):
    from dagster._core.events import DagsterEventBatchMetadata, generate_event_batch_id

    monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE", raising=False)
    run_id, batches = _run_ranged(tmp_path / "run", monkeypatch)
    planned = batches[0]  # three planned materializations and the planned check
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    calls = []
    original = PooledSqliteEventLogStorage._store_asset_event

    def locked_on_the_third(self, conn, event, event_id):
        calls.append(event_id)
        if len(calls) == 3:
            raise sqlite3.OperationalError("database is locked")
        return original(self, conn, event, event_id)

    monkeypatch.setattr(PooledSqliteEventLogStorage, "_store_asset_event", locked_on_the_third)
    key, check_key = dg.AssetKey("ranged"), dg.AssetCheckKey(dg.AssetKey("ranged"), "rows_ok")
    with dg.DagsterInstance.get() as instance:
        batch_id = generate_event_batch_id()
        for i, entry in enumerate(planned):  # as Dagster's run creation hands them over
            instance.handle_new_event(entry, batch_metadata=DagsterEventBatchMetadata(batch_id, i == len(planned) - 1))
        storage = instance.event_log_storage
        # The batch failed in index.db and was rolled back; Dagster's fallback stored each event once more.
        index_planned = storage.get_event_records(
            dg.EventRecordsFilter(event_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED, asset_key=key))
        assert sorted(r.event_log_entry.dagster_event.partition for r in index_planned) == ["a", "b", "c"]
        assert len(storage.get_asset_check_execution_history(check_key, 10)) == 1
        assert len(storage.get_records_for_run(run_id).records) == 2 * len(planned)  # the run's log: twice
    assert len(calls) == 3 + 3  # the failed batch got to its third asset event; the fallback did all three


def test_table_checks_are_remembered_until_wipe(tmp_path, monkeypatch):
    """Dagster asks "does index.db have asset_event_tags?" per tagged event, with a new engine each time."""
    pooled = PooledSqliteEventLogStorage(str(tmp_path))
    asked: list[str] = []
    original = SqliteEventLogStorage.has_table
    monkeypatch.setattr(SqliteEventLogStorage, "has_table", lambda self, name: asked.append(name) or original(self, name))

    def tagged(partition: str) -> dg.EventLogEntry:
        entry = _materialization("run-a", partition)
        materialization = entry.dagster_event.event_specific_data.materialization
        data = StepMaterializationData(materialization._replace(tags={"dagster/data_version": f"v-{partition}"}))
        return entry._replace(dagster_event=entry.dagster_event._replace(event_specific_data=data))

    for i in range(5):
        pooled.store_event(tagged(f"cat-{i}"))
    assert asked.count("asset_event_tags") == 1
    tags = pooled.get_event_tags_for_asset(ASSET)
    assert sorted(t["dagster/data_version"] for t in tags) == [f"v-cat-{i}" for i in range(5)]
    pooled.wipe()
    pooled.store_event(tagged("cat-9"))
    assert asked.count("asset_event_tags") == 2  # asked again after a wipe
    assert [t["dagster/data_version"] for t in pooled.get_event_tags_for_asset(ASSET)] == ["v-cat-9"]


def _open_files(path) -> int:
    """How many of this process's file descriptors are open on ``path`` (Linux /proc)."""
    import os

    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:
            pass
    return count


def test_an_evicted_shard_closes_its_file(tmp_path):
    """The bound on engines is a bound on open files: a run pushed out of the pool is closed."""
    pooled = PooledSqliteEventLogStorage(str(tmp_path))
    pooled.store_event(_materialization("run-0", "cat-0"))
    assert _open_files(tmp_path / "run-0.db") >= 1  # kept open for the next event
    for i in range(1, MAX_ENGINES + 1):
        pooled.store_event(_materialization(f"run-{i}", "cat-0"))
    assert "run-0" not in pooled.open_shards
    assert _open_files(tmp_path / "run-0.db") == 0
    pooled.dispose()


def test_a_batch_of_several_runs_writes_each_event_to_its_own_run(tmp_path):
    pooled = PooledSqliteEventLogStorage(str(tmp_path))
    pooled.store_event_batch([_materialization("run-a", "cat-0"), _materialization("run-b", "cat-1"),
                              _materialization("run-a", "cat-2")])
    assert _partitions(pooled, "run-a") == ["cat-0", "cat-2"]
    assert _partitions(pooled, "run-b") == ["cat-1"]
    latest = pooled.get_latest_materialization_events([ASSET])[ASSET]
    assert (latest.run_id, latest.dagster_event.partition) == ("run-a", "cat-2")


def test_a_missing_table_is_asked_about_again(tmp_path):
    """Only a positive answer is remembered: a table created later (an upgrade) is then seen."""
    pooled = PooledSqliteEventLogStorage(str(tmp_path))
    pooled.store_event(_materialization("run-a", "cat-0"))
    assert pooled.has_table("no_such_table") is False
    assert pooled.has_table("no_such_table") is False
    with sqlite3.connect(tmp_path / "index.db") as conn:
        conn.execute("CREATE TABLE no_such_table (id INTEGER)")
    assert pooled.has_table("no_such_table") is True
    pooled.dispose()


def test_table_checks_are_asked_again_after_an_upgrade(tmp_path, monkeypatch):
    pooled = PooledSqliteEventLogStorage(str(tmp_path))
    pooled.store_event(_materialization("run-a", "cat-0"))
    asked: list[str] = []
    original = SqliteEventLogStorage.has_table
    monkeypatch.setattr(SqliteEventLogStorage, "has_table", lambda self, name: asked.append(name) or original(self, name))
    assert pooled.has_table("asset_event_tags") and pooled.has_table("asset_event_tags")
    assert asked == ["asset_event_tags"]
    pooled.upgrade()
    assert pooled.has_table("asset_event_tags")
    assert asked == ["asset_event_tags", "asset_event_tags"]  # an upgrade may add or drop tables
    pooled.dispose()


def test_the_index_is_left_to_sqlites_own_checkpoints(tmp_path):
    """Only run databases get a checkpoint per use (the UI watches their .db files); index.db
    keeps its write-ahead log until SQLite's ~1,000-page checkpoint, so an event costs one write."""
    import os

    pooled = PooledSqliteEventLogStorage(str(tmp_path))
    for i in range(3):
        pooled.store_event(_materialization("run-a", f"cat-{i}"))

    def rows_in_the_db_file_alone(name: str) -> int:
        copy = tmp_path / f"copy-{name}"
        shutil.copyfile(tmp_path / name, copy)  # without its -wal: what checkpoints copied into the file
        conn = sqlite3.connect(copy)
        try:
            return conn.execute("SELECT COUNT(*) FROM event_logs").fetchone()[0]
        except sqlite3.OperationalError:  # the table itself is still in the WAL
            return 0
        finally:
            conn.close()
            os.remove(copy)

    assert rows_in_the_db_file_alone("run-a.db") == 3
    assert rows_in_the_db_file_alone("index.db") == 0
    pooled.dispose()


def test_dagster_event_batch_size_is_read_from_the_mapping_given(monkeypatch):
    """Given a mapping, that mapping is checked, not this process's environment."""
    from scrape_assets.instance_storage import configured_event_batch_size

    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "abc")
    assert configured_event_batch_size({"DAGSTER_EVENT_BATCH_SIZE": "0"}) == 0
    assert configured_event_batch_size({"DAGSTER_EVENT_BATCH_SIZE": "25"}) == 25
    assert configured_event_batch_size({}) is None


def test_the_default_batch_holds_the_planned_events_of_a_100_category_run(tmp_path, monkeypatch):
    """~400 planned materializations at run creation: one batch, not several (module docstring)."""
    shutil.copy(REPO_ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE", raising=False)
    with dg.DagsterInstance.get() as instance:
        assert instance._get_event_batch_size() == 1000


def test_an_asset_check_result_in_a_batch_updates_the_checks_status(tmp_path, monkeypatch):
    """A batch with an event kind the fast path does not write (a check's evaluation) is stored as
    store_event stores it: the planned check becomes a succeeded one."""
    monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE", raising=False)
    run_id, batches = _run_ranged(tmp_path / "run", monkeypatch)
    log = SqliteEventLogStorage(str(tmp_path / "run" / "history" / "runs")).get_records_for_run(run_id).records
    (evaluation,) = [r.event_log_entry for r in log
                     if r.event_log_entry.dagster_event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION]
    check_key = dg.AssetCheckKey(dg.AssetKey("ranged"), "rows_ok")
    storage = PooledSqliteEventLogStorage(str(tmp_path / "replay"))
    storage.store_event_batch(batches[0])  # planned materializations and the planned check
    (planned,) = storage.get_asset_check_execution_history(check_key, 10)
    assert planned.status.value == "PLANNED"
    storage.store_event_batch([evaluation] + batches[1])
    (evaluated,) = storage.get_asset_check_execution_history(check_key, 10)
    assert evaluated.status.value == "SUCCEEDED"
    assert storage.get_materialized_partitions(dg.AssetKey("ranged")) == {"a", "b", "c"}


def test_another_thread_never_gets_the_batchs_own_index_connection(tmp_path, monkeypatch):
    """Inside a batch only its own thread shares the batch's transaction; another thread (the
    UI reading asset pages) waits for the storage lock and gets a connection of its own."""
    import threading

    storage = PooledSqliteEventLogStorage(str(tmp_path))
    original = PooledSqliteEventLogStorage._store_asset_event
    got, entered = [], threading.Event()

    def reader():
        with storage.index_connection() as conn:
            got.append(conn)
            entered.set()

    threads = []

    def during_the_batch(self, conn, event, event_id):
        if not threads:
            threads.append(threading.Thread(target=reader))
            threads[0].start()
            entered.wait(1.0)  # a reader sharing the batch's connection gets it at once; one waiting, never
            got.append(("batch", conn))
        return original(self, conn, event, event_id)

    monkeypatch.setattr(PooledSqliteEventLogStorage, "_store_asset_event", during_the_batch)
    storage.store_event_batch([_materialization("run-a", "cat-0"), _materialization("run-a", "cat-1")])
    threads[0].join(30)
    assert [type(g).__name__ for g in got] == ["tuple", "Connection"]  # the reader got in only after the batch
    assert got[1] is not got[0][1]
    assert _partitions(storage, "run-a") == ["cat-0", "cat-1"]
    storage.dispose()


def test_a_batch_with_log_messages_keeps_them_out_of_the_index(tmp_path):
    """A batch that holds a plain log line (no Dagster event) is stored as store_event stores
    each event: every line in the run's log, only the asset event in index.db."""
    def log_line(message: str) -> dg.EventLogEntry:
        return dg.EventLogEntry(error_info=None, level=20, user_message=message, run_id="run-a", timestamp=time.time(),
                                step_key="raw_pages", job_name="job", dagster_event=None)

    pooled = PooledSqliteEventLogStorage(str(tmp_path))
    pooled.store_event_batch([log_line("fetching"), _materialization("run-a", "cat-0"), log_line("done")])
    assert [r.event_log_entry.user_message or r.event_log_entry.dagster_event_type.value
            for r in pooled.get_records_for_run("run-a").records] == ["fetching", "ASSET_MATERIALIZATION", "done"]
    pooled.dispose()
    with sqlite3.connect(tmp_path / "index.db") as conn:
        assert conn.execute("SELECT dagster_event_type FROM event_logs").fetchall() == [("ASSET_MATERIALIZATION",)]


def test_an_older_run_storage_block_alone_keeps_the_pooled_event_log(tmp_path, monkeypatch):
    """Dagster's older per-storage blocks: a ``run_storage:`` block configures the runs only;
    the event log it leaves unconfigured is the instance's SQLite default, the pooled one."""
    (tmp_path / "dagster.yaml").write_text(
        (REPO_ROOT / "dagster.yaml").read_text()
        + f"run_storage:\n  module: dagster._core.storage.runs\n  class: SqliteRunStorage\n"
          f"  config:\n    base_dir: {tmp_path / 'runs_elsewhere'}\n")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE", raising=False)
    with dg.DagsterInstance.get() as instance:
        assert isinstance(instance.event_log_storage, PooledSqliteEventLogStorage)
        assert instance.event_log_storage._base_dir == str(tmp_path / "history" / "runs")
        assert instance._get_event_batch_size() == 1000
