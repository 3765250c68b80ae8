"""Object storage: atomic writes, root confinement, temp-file sweeping."""

from __future__ import annotations

import os
import pickle
import stat

import pytest

from scrape_assets.errors import StorageError
from scrape_assets.storage import ObjectStore, redact_url


@pytest.mark.parametrize(
    "key",
    ["../escape", "a/../../b", "/etc/passwd", "a//b", "a/%2e%2e/b", "a/..%2fb", "a\\b", "a/.hidden/..", "", "a/b\x00",
     "demo\n", "a/b\n"],  # a trailing newline: "$" matches before it
)
def test_keys_that_escape_the_root_are_refused(tmp_path, key):
    store = ObjectStore(str(tmp_path / "root"))
    with pytest.raises(StorageError, match="invalid storage key segment"):
        store.write_bytes_atomic(key, b"x")
    assert not (tmp_path / "escape").exists()
    assert list(tmp_path.rglob("*")) == [] or all(str(p).startswith(str(tmp_path / "root")) for p in tmp_path.rglob("*"))


def test_atomic_write_replaces_whole_object_and_leaves_no_temp(tmp_path):
    store = ObjectStore(str(tmp_path))
    store.write_bytes_atomic("site/cat/snap/manifest.json", b"old")
    store.write_bytes_atomic("site/cat/snap/manifest.json", b"new-content")
    assert store.read_bytes("site/cat/snap/manifest.json") == b"new-content"
    assert sorted(os.listdir(tmp_path / "site/cat/snap")) == ["manifest.json"]


def test_failed_write_keeps_the_previous_object(tmp_path, monkeypatch):
    store = ObjectStore(str(tmp_path))
    store.write_bytes_atomic("a/b.json", b"good")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(StorageError, match="a/b.json: write failed"):
        store.write_bytes_atomic("a/b.json", b"partial")
    monkeypatch.undo()
    assert store.read_bytes("a/b.json") == b"good"
    assert os.listdir(tmp_path / "a") == ["b.json"]  # the temp file was removed


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names synced folders through Linux /proc")
def test_folder_fsync_can_be_deferred_to_one_call(tmp_path, monkeypatch):
    store = ObjectStore(str(tmp_path))
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        where = os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), tmp_path)
        synced.append(f"folder {where}" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    store.write_bytes_atomic("s/c/snap/manifest.json", b"m")
    # Each new folder recorded in its parent, then the file, then its rename: durable on return.
    assert synced == ["folder .", "folder s", "folder s/c", "file", "folder s/c/snap"]
    synced.clear()
    for n in range(1, 4):  # a new folder is created on the first write, without a mkdir per write
        store.write_bytes_atomic(f"s/c/snap/pages/page-{n:04d}.html", b"p", sync_folder=False)
    assert synced == ["folder s/c/snap", "file", "file", "file"]
    store.sync_folder("s/c/snap/pages")
    store.sync_folder("s/c/no-such-folder")  # nothing to do
    assert synced == ["folder s/c/snap", "file", "file", "file", "folder s/c/snap/pages"]
    assert sorted(os.listdir(tmp_path / "s/c/snap/pages")) == ["page-0001.html", "page-0002.html", "page-0003.html"]


def test_first_writes_racing_into_new_folders_all_land(tmp_path):
    """Page bodies of a new snapshot are written by several threads at once: each first write
    into a folder not made yet may find it made by another meanwhile."""
    from concurrent.futures import ThreadPoolExecutor

    store = ObjectStore(str(tmp_path))
    keys = [f"s/c{n % 10}/snap/pages/page-{n:04d}.html" for n in range(200)]
    with ThreadPoolExecutor(8) as pool:
        written = list(pool.map(lambda key: store.write_bytes_atomic(key, key.encode()), keys))
    assert written == [len(key) for key in keys]
    assert all(store.read_bytes(key) == key.encode() for key in keys)


def test_a_path_through_a_dangling_symlink_is_refused_as_such(tmp_path):
    from scrape_assets.storage import refusal

    store = ObjectStore(str(tmp_path))
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "c").symlink_to(tmp_path / "unmounted-volume")  # a category folder on a volume not there
    with pytest.raises(StorageError) as info:
        store.write_bytes_atomic("s/c/snap/manifest.json", b"m")
    assert isinstance(info.value.__cause__, FileExistsError) and refusal(info.value.__cause__)  # no retry helps
    assert str(tmp_path / "s" / "c") in str(info.value)


def test_appends_keep_the_journal_open_and_delete_or_close_releases_it(tmp_path, monkeypatch):
    from scrape_assets import storage

    store = ObjectStore(str(tmp_path))
    store.write_bytes_atomic("s/c/snap/manifest.json", b"{}")
    for n in range(3):
        store.append_bytes("s/c/snap/manifest.journal", f"line {n}\n".encode())
        # each line is in the file as soon as the call returns (what a killed process leaves)
        assert (tmp_path / "s/c/snap/manifest.journal").read_bytes().count(b"\n") == n + 1
    assert list(store._appends) == ["s/c/snap/manifest.journal"]
    store.delete("s/c/snap/manifest.journal")  # compaction removes the journal: its handle goes too
    assert store._appends == {} and not (tmp_path / "s/c/snap/manifest.journal").exists()
    store.append_bytes("s/c/snap/manifest.journal", b"after\n")  # a new journal, not the unlinked file
    assert (tmp_path / "s/c/snap/manifest.journal").read_bytes() == b"after\n"

    monkeypatch.setattr(storage, "MAX_OPEN_APPENDS", 2)
    for name in ("a", "b", "c"):
        store.write_bytes_atomic(f"s/{name}/manifest.json", b"{}")
        store.append_bytes(f"s/{name}/manifest.journal", b"x\n")
    assert list(store._appends) == ["s/b/manifest.journal", "s/c/manifest.journal"]  # least recent closed
    store.append_bytes("s/a/manifest.journal", b"y\n")  # reopened
    assert (tmp_path / "s/a/manifest.journal").read_bytes() == b"x\ny\n"
    copy = pickle.loads(pickle.dumps(store))  # a worker process gets the store without open files
    assert copy._appends == {} and copy.read_bytes("s/a/manifest.journal") == b"x\ny\n"
    store.close()
    assert store._appends == {}


def test_sweep_removes_orphaned_temp_files(tmp_path):
    store = ObjectStore(str(tmp_path))
    store.write_bytes_atomic("s/c/snap/pages/page-0001.html", b"x")
    orphan = tmp_path / "s/c/snap/pages/.page-0002.html.deadbeef.tmp"
    orphan.write_bytes(b"half")
    assert store.sweep_temp_files("s/c/snap") == 1
    assert not orphan.exists()
    assert store.read_bytes("s/c/snap/pages/page-0001.html") == b"x"


def test_unwritable_root_gives_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    store = ObjectStore(str(blocker / "objects"))
    with pytest.raises(StorageError, match="objects"):
        store.ensure_writable()


@pytest.mark.parametrize(("url", "shown"), [
    ("file://{root}/objects?token=s3cret", "file://{root}/objects?<hidden>"),
    ("file:{root}/objects?token=s3cret", "file://{root}/objects?<hidden>"),  # one slash: fsspec's local path too
    ("local://{root}/objects#s3cret", "local://{root}/objects#<hidden>"),
    ("file://{root}/o?", "file://{root}/o?<hidden>"),
    ("s3://bucket/prefix?region=s3cret", "s3://bucket/prefix?<hidden>"),  # keys under "prefix?region=..."
    ("memory://bucket/prefix#s3cret", "memory://bucket/prefix#<hidden>"),
])
def test_a_storage_url_with_a_query_is_refused_not_made_a_folder_name(tmp_path, url, shown):
    """fsspec keeps a query or fragment in the path: file:///data/objects?token=s3cret wrote into
    a folder named "objects?token=s3cret" (the run summary printed the token), and
    s3://bucket/prefix?region=eu wrote its objects under the prefix "prefix?region=eu"."""
    with pytest.raises(StorageError) as info:
        ObjectStore(url.format(root=tmp_path))
    assert str(info.value).startswith(shown.format(root=tmp_path) +  # where the query was, not what it held
                                      ": cannot open object storage: expected a storage URL with no query or fragment")
    assert "s3cret" not in str(info.value)
    assert list(tmp_path.iterdir()) == []
    store = ObjectStore(str(tmp_path / "objects?x#y"))  # a plain path may name such a folder
    store.write_bytes_atomic("a/b.html", b"x")
    assert (tmp_path / "objects?x#y" / "a" / "b.html").read_bytes() == b"x"


def test_memory_store_and_redaction():
    store = ObjectStore("memory://bucket/prefix")
    assert not store.is_local
    store.write_bytes_atomic("x/y.html", b"body")
    assert store.read_bytes("x/y.html") == b"body"
    assert store.list_names("x") == ["y.html"]
    assert redact_url("s3://key:secret@bucket/prefix?token=abc") == "s3://bucket/prefix"
    assert redact_url("https://hooks.example.com/services/T0/B0/SECRET", keep_path=False) == "https://hooks.example.com/…"



@pytest.mark.parametrize(("url", "shown"), [
    # A "/" in the password: urlsplit read "KEY:1234" as host and port, the rest of it as the path.
    ("s3://AKIAEXAMPLE:1234/wJalrS3CRET@bucket/prefix", "s3://<hidden>"),
    ("sftp://user:12#S3CRET@host/p", "sftp://<hidden>"),
    # An fsspec chain: each URL's user info dropped (the whole chain was read as a path).
    ("simplecache::s3://KEY:S3CRET@bucket/p", "simplecache::s3://bucket/p"),
    ("zip://a.csv::s3://KEY:S3CRET@bucket/x.zip", "zip://a.csv::s3://bucket/x.zip"),
    # IPv6 hosts keep their brackets (were "http://::1:8000/x"), and are no chain.
    ("http://[::1]:8000/x?token=S3CRET", "http://[::1]:8000/x"),
    ("simplecache::http://u:S3CRET@[::ffff:1.2.3.4]:80/b", "simplecache::http://[::ffff:1.2.3.4]:80/b"),
    ("hf://datasets/user/repo@main/path", "hf://datasets/user/repo@main/path"),  # an "@" of the path stays
    # An "@" in the password before its "/", "?" or "#": urlsplit took the text after it as the host.
    ("postgresql://alice:p@S3CRET/word@db.internal/shop", "postgresql://<hidden>"),
    ("postgresql://alice:p@S3CRET?word@db.internal/shop", "postgresql://<hidden>"),
    ("http://alice:qa9@S3CRET#qc5@host.example/db", "http://<hidden>"),
    # "::scheme://" inside a query is no chain: the query stays hidden.
    ("https://shop.example/list?ref=a::https://partner.example/p/S3CRET", "https://shop.example/list"),
    ("http://[::1]/x?email=a@b", "http://[::1]/x"),  # the ":" of an IPv6 host is no port
    # ... but brackets inside a password are no IPv6 host: urlsplit took "[::1]" as the host.
    ("postgresql://u:[::1]/S3CRET@h/db", "postgresql://<hidden>"),
    ("postgresql://u:x[v1.S3CRET]/y@db/shop", "postgresql://<hidden>"),
    ("http://[fe80::1%25eth0]:8000/x", "http://[fe80::1%25eth0]:8000/x"),
    # A password holding "::scheme://" is no chain; a one-letter scheme with "//" is no drive letter.
    ("s3://u:x::ab://S3C/RET@db", "s3://<hidden>"),
    ("b://u:S3CRET@db", "b://db"),
    ("a::b://u:S3CRET@db", "a::b://db"),
    ("C://Users/Me", "C://Users/Me"),  # a drive letter with no user info: as typed
    # A scheme urlsplit does not read ("_" is allowed in a SQLAlchemy driver's name).
    ("postgresql+psycopg_2://scraper:S3CRET@db/shop", "postgresql+psycopg_2://<hidden>"),
    ("oracle+cx_oracle://scott:S3CRET@db:1521/x", "oracle+cx_oracle://<hidden>"),
])
def test_redact_url_hides_credentials_urlsplit_misreads(url, shown):
    assert redact_url(url) == shown


@pytest.mark.parametrize(("url", "shown"), [
    ("s3://AKIAEXAMPLE:1234/wJalrS3CRET@bucket/prefix?region=eu", "s3://<hidden>"),
    ("simplecache::s3://KEY:S3CRET@bucket/p?x=1", "simplecache::s3://bucket/p?<hidden>"),
    ("data/objects?token=S3CRET", "data/objects?token=S3CRET"),  # a plain path: as typed, nothing was cut
])
def test_a_refused_storage_url_shows_no_credentials(url, shown):
    """The query check ran before the S3 credentials check: an s3:// URL with both was named by
    redact_url, which kept most of a secret holding a "/" (review of 0885d3c)."""
    from scrape_assets.storage import shown_storage_url

    assert shown_storage_url(url) == shown
    if "://" in url:
        with pytest.raises(StorageError) as info:
            ObjectStore(url)
        assert "S3CRET" not in str(info.value) and "1234" not in str(info.value)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_list_files_recurses_with_sizes_and_delete_listed_removes_temp_files_too(tmp_path, where):
    store = ObjectStore(str(tmp_path / "objects") if where == "local" else f"memory://bucket-{tmp_path.name}/root")
    store.write_bytes_atomic("s/c/snap/manifest.json", b"{}")
    store.write_bytes_atomic("s/c/snap/pages/page-0001.html", b"<html>1</html>")
    store.write_bytes_atomic("s/c/snap-1/page.html", b"x")  # a same-second twin: a prefix, not a child
    expected = [("s/c/snap/manifest.json", 2), ("s/c/snap/pages/page-0001.html", 14)]
    if where == "local":  # a temp file left by a killed write: listed, although not a valid key
        (tmp_path / "objects/s/c/snap/.parsed.json.0a1b.tmp").write_bytes(b"{")
        expected.insert(0, ("s/c/snap/.parsed.json.0a1b.tmp", 1))
    assert store.list_files("s/c/snap") == expected
    for key, _ in expected:
        store.delete_listed(key)
    assert store.list_files("s/c/snap") == [] and store.read_bytes("s/c/snap-1/page.html") == b"x"
    for bad in ("s/c/../escape.html", "s/c/snap/..", "/etc/passwd"):
        with pytest.raises(StorageError):
            store.delete_listed(bad)


def test_redact_url_hides_a_host_that_may_be_part_of_a_password():
    assert redact_url("http://user:pa/ss@proxy.corp:3128") == "http://<hidden>"  # 'pa' is no port


def test_redact_url_keeps_the_slashes_of_a_url_without_a_host():
    """``sqlite:////abs/w.db`` is an absolute path and ``sqlite:///w.db`` a relative one: an
    error showing the URL must not turn one into the other (urlunsplit drops the "//")."""
    assert redact_url("sqlite:////srv/data/warehouse.db") == "sqlite:////srv/data/warehouse.db"
    assert redact_url("sqlite:///data/w.db?mode=ro") == "sqlite:///data/w.db"
    assert redact_url("file:///srv/objects") == "file:///srv/objects"
    assert redact_url("postgresql://scraper:hunter2@db.internal/shop") == "postgresql://db.internal/shop"


def test_a_crawl_makes_its_page_bodies_durable_before_it_declares_the_snapshot_complete(tmp_path, monkeypatch):
    """Bodies are renamed into pages/ without a folder fsync each; one fsync of pages/ must
    come before the manifest that says complete, or a power loss could leave a complete
    snapshot whose bodies are gone (only incomplete ones are healed by a resume)."""
    import json

    from scrape_assets_tests.conftest import crawl_demo

    events: list[str] = []
    real_sync, real_write = ObjectStore.sync_folder, ObjectStore.write_bytes_atomic

    def sync_folder(self, key):
        events.append(f"sync {key}")
        return real_sync(self, key)

    def write_bytes_atomic(self, key, data, **kwargs):
        if key.endswith("/manifest.json"):
            events.append("manifest complete" if json.loads(data).get("completed_at") else "manifest")
        return real_write(self, key, data, **kwargs)

    monkeypatch.setattr(ObjectStore, "sync_folder", sync_folder)
    monkeypatch.setattr(ObjectStore, "write_bytes_atomic", write_bytes_atomic)
    [report] = crawl_demo(tmp_path / "objects", ["mystery"])  # 2 pages
    prefix = f"demo/mystery/{report.snapshot_id}"
    assert events.index(f"sync {prefix}/pages") < events.index("manifest complete")


def test_the_temp_file_is_fsynced_before_it_is_renamed_over_the_target(tmp_path, monkeypatch):
    """The rename must not reach the disk before the bytes it points to: after a power loss the
    target would be the new name of a file whose content was never written (zero-length)."""
    store = ObjectStore(str(tmp_path))
    store.write_bytes_atomic("s/c/snap/manifest.json", b"old")
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def recording_fsync(fd):
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def recording_replace(src, dst):
        events.append(f"rename to {os.path.basename(dst)}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    store.write_bytes_atomic("s/c/snap/manifest.json", b"new")
    assert events == ["fsync file", "rename to manifest.json", "fsync folder"]
    assert store.read_bytes("s/c/snap/manifest.json") == b"new"


def test_sweep_leaves_objects_whose_own_name_ends_in_tmp(tmp_path):
    """Only the temp files of atomic writes (".<name>.<hex>.tmp", hidden) are orphans: an object
    whose key ends in ".tmp" (a valid key) is data."""
    store = ObjectStore(str(tmp_path))
    store.write_bytes_atomic("s/c/snap/export.tmp", b"data")
    orphan = tmp_path / "s/c/snap/.parsed.json.0a1b.tmp"
    orphan.write_bytes(b"half")
    assert store.sweep_temp_files("s/c/snap") == 1
    assert not orphan.exists() and store.read_bytes("s/c/snap/export.tmp") == b"data"


def test_a_read_only_file_system_is_a_refusal_a_full_disk_is_not(tmp_path, monkeypatch):
    """EROFS (a read-only mount) is no failure a retry fixes: the write probe says the storage is
    not writable; a full disk or an I/O error may pass, and is reported as a failed probe."""
    import errno

    from scrape_assets.storage import refusal

    assert refusal(OSError(errno.EROFS, "Read-only file system"))
    assert not refusal(OSError(errno.ENOSPC, "No space left on device"))
    assert not refusal(OSError(errno.EIO, "Input/output error"))
    store = ObjectStore(str(tmp_path / "objects"))
    for code, said in ((errno.EROFS, "object storage is not writable"), (errno.ENOSPC, "its write probe failed")):
        def failing_replace(src, dst, code=code):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(os, "replace", failing_replace)
        with pytest.raises(StorageError) as info:
            store.ensure_writable()
        monkeypatch.undo()
        assert f"{store.describe()}: {said}: " in str(info.value)
        assert refusal(info.value.__cause__) is (code == errno.EROFS)


def test_a_remote_listing_outside_the_prefix_is_refused_not_turned_into_keys(tmp_path):
    """An object store may list the prefix itself when it is an object (a file where a folder
    was expected): list_files refuses the listing rather than name a key such as "s/c/snap/"
    that delete_listed would then be asked to remove."""
    store = ObjectStore(f"memory://bucket-{tmp_path.name}/root")
    store.write_bytes_atomic("s/c/snap", b"x")
    with pytest.raises(StorageError, match="outside"):
        store.list_files("s/c/snap")
