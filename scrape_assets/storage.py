"""Object storage for raw pages, manifests and parsed output.

One :class:`ObjectStore` wraps a root given as an fsspec URL (via universal_pathlib):
a local folder by default (``$SCRAPE_DATA_DIR/objects``), ``s3://bucket/prefix`` in
production (install the ``s3`` extra), ``memory://`` in tests.

Keys are ``/``-separated relative paths built from validated segments; a key that
could escape the root (``..``, absolute, backslashes, percent-encoded separators,
control characters) raises :class:`~scrape_assets.errors.StorageError` before any I/O.

Writes are atomic: on a local disk a temp file in the same folder is written,
fsynced, renamed over the target and the folder fsynced (POSIX ``rename(2)`` is
atomic); on object stores a single PUT is atomic by construction. A reader therefore
sees the old object or the new one, never a mix. Temp files orphaned by a crash
(``.*.tmp``) are removed by :meth:`ObjectStore.sweep_temp_files`.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import hashlib
import os
import re
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit, urlunsplit

from upath import UPath

from scrape_assets.crashpoints import crashpoint
from scrape_assets.errors import MissingBucketError, StorageError

_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,127}$")
TEMP_SUFFIX = ".tmp"
#: Most journal files one ObjectStore keeps open for appends (least recently used closed first).
MAX_OPEN_APPENDS = 64
_PROBE = re.compile(r"^\.?write-probe-(\d+)-(?:ns([0-9a-f]{12})-)?")
#: Age (seconds) before a write probe of another PID namespace (or host), or of unknown
#: origin, whose process id is not running here is removed.
PROBE_MIN_AGE_S = 60.0
#: fsspec protocols of object stores: flat keys (no folder to create before a PUT), listings
#: that fsspec would cache. Other remote filesystems (sftp, smb, ...) keep fsspec's defaults.
OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "memory"})
#: S3's protocols: its root's first segment is a bucket that :meth:`ObjectStore.check_root`
#: checks (gcsfs and adlfs answer a bucket check differently, untested here), and s3fs
#: options apply.
S3_PROTOCOLS = frozenset({"s3", "s3a"})
#: Top-level modules of remote stores' clients: their own exceptions (not OSErrors) are
#: storage failures; any other exception (a bug, a TypeError) is left as it is.
CLIENT_MODULES = frozenset({"botocore", "aiobotocore", "s3fs", "gcsfs", "google", "adlfs", "azure", "aiohttp",
                            "fsspec", "urllib3", "requests"})
#: What to check when a remote store's client fails before it reaches the store, by the
#: client's exception class (botocore's): appended to the error.
CLIENT_HINTS = {
    "EndpointConnectionError": "check the endpoint (AWS_ENDPOINT_URL, or the profile's) and the network",
    "ConnectTimeoutError": "check the endpoint (AWS_ENDPOINT_URL, or the profile's) and the network",
    "NoCredentialsError": "give credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or an "
                          "instance role",
    "PartialCredentialsError": "give both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    "InvalidEndpointError": "set AWS_ENDPOINT_URL (or the profile's endpoint_url) to an http(s)://host[:port] URL",
}



class InvalidEndpointError(ValueError):
    """The object store client's endpoint is not a URL (botocore: "Invalid endpoint: ...")."""


#: What a listing of a prefix that is not a folder raises: an empty listing, not a failure.
_NOT_THERE = (FileNotFoundError, NotADirectoryError)


def refusal(cause: BaseException | None) -> bool:
    """Whether ``cause`` (a storage error's ``__cause__``) is a refusal no retry changes: no
    permission (``PermissionError``, also s3fs's for S3's AccessDenied), a read-only file
    system, a path that cannot become a folder (a file in the way: ENOTDIR, EEXIST), or a
    missing filesystem driver. A full disk, an I/O error or a remote store not answering
    is not: those may pass."""
    if isinstance(cause, (PermissionError, ImportError)):
        return True
    return isinstance(cause, OSError) and cause.errno in (errno.EROFS, errno.ENOTDIR, errno.EEXIST)


@functools.lru_cache(maxsize=1)
def _pid_namespace_tag() -> str | None:
    """12 hex digits naming this host's boot and this process's PID namespace (Linux), so a
    write probe's process id can be checked by the processes that share its namespace; None
    where either cannot be read."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return hashlib.sha256(f"{boot_id}:{namespace}".encode()).hexdigest()[:12]


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


#: The "::" between the URLs of an fsspec chain (``simplecache::s3://bucket``), before a
#: "scheme://", so that an IPv6 address (``http://[::1]/``, ``[::ffff:1.2.3.4]``) is no chain.
_CHAIN_SEPARATOR = re.compile(r"::(?=[A-Za-z][A-Za-z0-9+.-]*://)")


def redact_url(url: str, *, keep_path: bool = True) -> str:
    """Return ``url`` without user info or query (where credentials hide), for logs and metadata.

    Pass ``keep_path=False`` for URLs whose path is itself a secret (webhooks).
    """
    head = re.split(r"[?#]", url, maxsplit=1)[0]  # a "::scheme://" in a query is no chain: its text stays hidden
    if len(chain := _CHAIN_SEPARATOR.split(head)) > 1:  # an fsspec chain (simplecache::s3://...): each URL on its own
        if any(":" in (netloc := part.partition("://")[2].split("/", 1)[0]) or "@" in netloc for part in chain[:-1]):
            # "s3://u:x::ab://SEC/RET@db": a password holding "::scheme://", no chain
            return f"{url.partition(':')[0]}://<hidden>"
        chain[-1] += url[len(head):]
        return "::".join(redact_url(part, keep_path=keep_path) for part in chain)
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unbalanced '[' (as in an unencoded password): show none of it
        scheme, sep, _ = url.partition("://")
        return f"{scheme}://<hidden>" if sep else "<hidden>"
    if not parts.scheme or (len(parts.scheme) == 1 and (url[2:4] != "//" or "@" not in url)):
        # A plain path or a Windows drive letter ("C:/x", "C://Users" as typed), unless it holds
        # user info: "b://u:pw@db" is a URL, as is "a_b://u:pw@h" (SQLAlchemy allows "_" in a
        # driver's name, urlsplit in no scheme).
        scheme, sep, _ = url.partition("://")
        return f"{scheme}://<hidden>" if sep and "@" in url and not parts.scheme else url
    after_netloc = url.partition("://")[2][len(parts.netloc):]
    # Without user info an IPv6 address comes first: only then is a ":" inside brackets no port.
    host_port = parts.netloc.rpartition("]")[2] if parts.netloc.startswith("[") else parts.netloc
    if "@" in after_netloc and ("@" in parts.netloc or ":" in host_port):
        # user:password@host with a "/", "?" or "#" in the password (before or after an "@" in
        # it): urlsplit ends the user info early and shows the rest of the password as the
        # host or path. Also hides a URL with a port and an "@" in its path or query
        # (http://127.0.0.1:8000/@shop/), which cannot be told apart from "user:1234/...@host".
        return f"{parts.scheme}://<hidden>"
    try:
        port = parts.port
    except ValueError:  # not a number: the "host" may be part of an unencoded password
        return f"{parts.scheme}://<hidden>"
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 address, in its brackets again
        host = f"[{host}]"
    if port:
        host = f"{host}:{port}"
    path = parts.path if keep_path else "/…"
    if not host and url[len(parts.scheme) + 1:].startswith("//"):  # sqlite:///w.db, file:///x: urlunsplit drops "//"
        return f"{parts.scheme}://{path}"
    return urlunsplit((parts.scheme, host, path, "", ""))


#: What a storage URL with a query or fragment is told (see :func:`query_problem`).
QUERY_PROBLEM = (
    "a storage URL with no query or fragment: fsspec makes '?...' or '#...' part of the folder or object "
    "names (s3://bucket/prefix?region=x writes under the prefix 'prefix?region=x'), e.g. s3://bucket/prefix or "
    "file:///srv/scrape/objects; S3 options come from AWS_* variables (AWS_REGION, AWS_ENDPOINT_URL), and a local "
    "folder whose name holds '?' or '#' is given as a plain path"
)


def query_problem(url: str) -> str | None:
    """:data:`QUERY_PROBLEM` when the storage URL ``url`` (one with a protocol: a plain path
    may name any folder) holds a ``?`` or ``#``, else None."""
    return QUERY_PROBLEM if "?" in url or "#" in url else None


def shown_storage_url(url: str) -> str:
    """``url`` as :func:`redact_url` shows it, marked where a query or fragment was cut
    (``s3://bucket/prefix?<hidden>``), so a message about the query shows where it was."""
    cut = min((i for i in (url.find("?"), url.find("#")) if i >= 0), default=-1)
    shown = redact_url(url)
    if cut < 0 or shown == url:  # nothing cut (a plain path is shown as typed)
        return shown
    return shown if shown.endswith("<hidden>") else f"{shown}{url[cut]}<hidden>"


def check_key(key: str) -> list[str]:
    """Split and validate a storage key.

    Args:
        key: a relative key such as ``demo/travel/2026-11-30T084512Z/manifest.json``.

    Returns:
        The key's segments.

    Raises:
        StorageError: a segment is empty, ``.``/``..``, or has characters outside
            ``[A-Za-z0-9._=-]`` (which rules out separators, encoded or not).
    """
    segments = key.split("/")
    for segment in segments:
        if not _SEGMENT.fullmatch(segment) or segment in (".", ".."):  # (match: "x\n" passes "$")
            raise StorageError(
                key,
                f"invalid storage key segment {segment!r}: expected letters, digits, '.', '_', '=', '-' "
                "and no '..', absolute paths or separators",
            )
    return segments


class ObjectStore:
    """Atomic, root-confined object storage over an fsspec URL or a local path.

    Listings are never cached on object stores (:data:`OBJECT_STORE_PROTOCOLS`): fsspec's filesystems (s3fs among them)
    otherwise keep a folder's listing for the life of the process (``use_listings_cache``),
    so a long-lived process (a sensor's code server, a resumed crawl in the same process as
    an earlier listing) would not see, or even read, objects another process wrote after
    it first listed their folder. Each listing and existence check is a request instead.
    A read is one GET, a write one PUT (on S3, ``max_concurrency`` defaults to 1 for that).
    Errors of a remote store's client that are not ``OSError`` (botocore's
    ``NoCredentialsError``, ``EndpointConnectionError``) are raised as :class:`StorageError`
    like the others, so a crawl gives the attempt back instead of counting it.

    Args:
        url: root location: a local path or an fsspec URL (``file://``, ``s3://``, ``memory://``).
        storage_options: passed to fsspec (credentials belong here or in the environment,
            never in the URL, which appears redacted in logs); ``use_listings_cache``
            defaults to False on object stores, ``max_concurrency`` to 1 on S3.
    """

    def __init__(self, url: str, storage_options: dict | None = None):
        if url.startswith("~"):  # the user's home, as a shell would (fsspec would make ./~ of it)
            url = os.path.expanduser(url)
        self.url = url
        options = dict(storage_options or {})
        scheme = url.partition("://")[0].lower() if "://" in url else ""
        if scheme in OBJECT_STORE_PROTOCOLS:
            options.setdefault("use_listings_cache", False)
        if scheme in S3_PROTOCOLS:
            # One GET per read: with max_concurrency > 1 (s3fs's default is 10) s3fs first asks
            # each object's size (a HEAD) to split large reads; ours are pages and manifests.
            options.setdefault("max_concurrency", 1)
        try:
            self.root = UPath(url, **options)
        except (ValueError, ImportError) as exc:
            raise StorageError(redact_url(url), f"cannot open object storage: {exc}") from exc
        self.is_local = self.root.protocol in ("", "file", "local")
        if self.root.protocol in S3_PROTOCOLS:
            bucket = url.partition("://")[2].split("/", 1)[0]
            if "@" in bucket or (":" in bucket and not bucket.startswith("arn:")):  # (an access point ARN has ":")
                # s3fs reads no credentials from the URL: "key:secret@bucket" would be the bucket's
                # name ("key:wJalr" when the secret holds a "/"), and the client's refusal of that
                # name would repeat the secret in every message. No bucket name holds "@" or ":".
                # named <hidden>: redact_url may read "KEY:" or "KEY:1234" as host and port and keep
                # the rest of the secret as the path
                raise StorageError(f"{scheme}://<hidden>", "cannot open object storage: an s3:// URL names a bucket only,"
                                   " credentials (user:password@) and ports are not read: expected s3://bucket[/prefix],"
                                   " credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or an AWS profile, an"
                                   " endpoint from AWS_ENDPOINT_URL")
            try:  # a URL without a bucket ("s3:/bucket", "s3://") fails here, not at the first read
                self.root.joinpath("key")
                if not self.root.path.strip("/"):
                    raise ValueError("no bucket in the URL")
            except ValueError as exc:
                raise StorageError(redact_url(url), f"cannot open object storage: {exc}: expected s3://bucket[/prefix]") from exc
        if self.root.protocol and (problem := query_problem(url)):  # after the S3 credentials check (named <hidden>)
            raise StorageError(shown_storage_url(url), f"cannot open object storage: expected {problem}")
        self._flat = scheme in OBJECT_STORE_PROTOCOLS  # one PUT per write, no folders to create
        self._bucketed = scheme in S3_PROTOCOLS
        # Local disks: plain os.path joins under the validated root (UPath.joinpath costs
        # more than the write on a page-sized object), and journals kept open for appends.
        self._local_root = self.root.path if self.is_local else None
        self._appends: collections.OrderedDict[str, BinaryIO] = collections.OrderedDict()
        self._appends_lock = threading.Lock()

    def __getstate__(self) -> dict:  # picklable for worker processes: open journals stay here
        return {k: v for k, v in self.__dict__.items() if k not in ("_appends", "_appends_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._appends = collections.OrderedDict()
        self._appends_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ObjectStore({self.describe()!r})"

    def describe(self) -> str:
        """The root as a person would type it, with credentials removed."""
        return str(self.root) if self.is_local else redact_url(self.url)

    def path(self, key: str) -> UPath:
        """The :class:`UPath` for ``key`` under the root (validated by :func:`check_key`)."""
        return self.root.joinpath(*check_key(key))

    def _local(self, key: str) -> str:
        """The local file path of ``key`` (local stores only; validated by :func:`check_key`)."""
        return os.path.join(self._local_root, *check_key(key))

    def check_root(self) -> None:
        """Fail early when the root cannot be what it names.

        A local root, or the nearest existing folder above it, must not be a file; an object
        store's bucket must exist (one request, which also meets a wrong endpoint or missing
        credentials once, instead of once per category). Readers (``summary``, ``prune``)
        would otherwise find nothing under it and report an empty store.

        Raises:
            StorageError: naming the root and what is wrong (a file in the way, no such
                bucket, the client's error with :data:`CLIENT_HINTS`).
        """
        if not self.is_local:
            if self._bucketed:
                bucket = self.root.path.split("/", 1)[0]
                try:
                    with self._errors("", "bucket check", (FileNotFoundError, PermissionError)):
                        self.root.fs.info(bucket)  # not fs.exists: it answers False for any error
                except FileNotFoundError:
                    raise self._error("", f"bucket {bucket!r} does not exist: create it, or fix the URL",
                                      MissingBucketError) from None
                except PermissionError:
                    # A policy may grant the prefix and not the bucket (HeadBucket), or the keys
                    # are wrong (S3 says 403 to both): one listing of the root tells them apart.
                    try:
                        with self._errors("", "listing", (FileNotFoundError,)):
                            self.root.fs.ls(self.root.path, detail=False)
                    except FileNotFoundError:
                        pass  # nothing stored yet
                    except StorageError as exc:
                        if isinstance(exc.__cause__, PermissionError):
                            raise self._error("", f"{exc.__cause__} (S3 refused both the bucket and the listing: "
                                                  "check the credentials and the policy)") from exc.__cause__
                        raise
            return
        for folder in (Path(self._local_root), *Path(self._local_root).parents):
            if folder.exists():
                if not folder.is_dir():
                    raise StorageError(self.describe(), f"{folder} is a file, not a folder")
                return

    def ensure_writable(self) -> None:
        """Create the root if needed and prove it is writable with a probe object.

        Probes (and their temp files) left at the root by a process killed mid-probe are
        removed first; the probe's name carries its process id for that (local roots only).

        Raises:
            StorageError: naming the root and the underlying error.
        """
        try:
            if self._flat:
                self.check_root()  # the bucket: one clear line rather than the probe's failed PUT
            else:  # an object store has no folders to make (and s3fs would create a missing bucket)
                self.root.mkdir(parents=True, exist_ok=True)
            self._sweep_dead_probes()
            tag = _pid_namespace_tag()
            probe = f"write-probe-{os.getpid()}-{f'ns{tag}-' if tag else ''}{uuid.uuid4().hex}"
            try:
                self.write_bytes_atomic(probe, b"ok")
            except StorageError as exc:  # the root named, not the probe; its cause kept (storage_refused reads it)
                detail = str(exc).removeprefix(f"{exc.location}: ").removeprefix("write failed: ")
                what = "object storage is not writable" if refusal(exc.__cause__) else "its write probe failed"
                raise StorageError(self.describe(), f"{what}: {detail}") from exc.__cause__
            self.path(probe).unlink()
        except StorageError:
            raise
        except ImportError as exc:
            raise self._no_driver(exc) from exc
        except Exception as exc:  # noqa: BLE001 - OSError, ValueError, a remote client's own errors
            detail = str(exc) if isinstance(exc, ValueError) else self._failure_detail(exc)
            if detail is None:  # not a storage failure: raised on a local disk; remotely, the probe failed
                if self.is_local:
                    raise
                detail = f"{type(exc).__name__}: {exc}"
            raise StorageError(self.describe(), f"object storage is not writable: {detail}") from exc

    def _sweep_dead_probes(self) -> None:
        """Remove probes of processes gone: at once when the probe names this PID namespace
        (:func:`_pid_namespace_tag`), else once :data:`PROBE_MIN_AGE_S` old: a process of
        another namespace (a container sharing the folder, another host) may have a number
        none has here, but its probe lives for milliseconds."""
        if not self.is_local:
            return
        now, here = time.time(), _pid_namespace_tag()
        for item in Path(self.root.path).glob("*write-probe-*"):
            match = _PROBE.match(item.name)
            if not match or _process_alive(int(match[1])):
                continue
            if here is None or match[2] != here:  # its number may be of another namespace's process
                try:
                    if now - item.stat().st_mtime < PROBE_MIN_AGE_S:
                        continue
                except FileNotFoundError:  # its process removed it meanwhile
                    continue
            item.unlink(missing_ok=True)

    def write_bytes_atomic(self, key: str, data: bytes, *, sync_folder: bool = True) -> int:
        """Write ``data`` to ``key`` atomically; return the number of bytes written.

        On a local disk: temp file, fsync, rename over the target, then fsync of the folder
        so the rename survives a power loss. ``sync_folder=False`` leaves that last fsync to
        a later :meth:`sync_folder` call covering many writes: a process crash loses nothing
        either way; a power loss before that call may lose the rename (the object is then
        missing, never partial). On object stores a write is one PUT.

        Raises:
            StorageError: the key is invalid or the write failed (the old object, if any, is intact).
        """
        with self._errors(key, "write"):
            try:
                if self.is_local:
                    _write_local_atomic(Path(self._local(key)), data, sync_folder=sync_folder)
                else:  # one PUT, atomic on object stores (which have no folders to create first)
                    target = self.path(key)
                    if not self._flat:
                        target.parent.mkdir(parents=True, exist_ok=True)
                    self.root.fs.pipe_file(target.path, data)
            except FileNotFoundError as exc:  # a folder or bucket that is not there: a failed write
                raise self._error(key, f"write failed: {exc}") from exc
        return len(data)

    def sync_folder(self, key: str) -> None:
        """fsync the folder at ``key`` (local disks; a no-op on object stores or if it does not exist).

        Makes the renames of earlier ``write_bytes_atomic(..., sync_folder=False)`` calls in
        that folder durable.

        Raises:
            StorageError: the fsync failed.
        """
        if not self.is_local:
            return
        try:
            _fsync_folder(Path(self._local(key)))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StorageError(f"{self.describe()}/{key}", f"folder fsync failed: {exc}") from exc

    def append_bytes(self, key: str, data: bytes) -> None:
        """Append ``data`` to a local object (journals). Not atomic: readers must tolerate a torn tail.

        The file stays open for the next append (unbuffered: every call is in the kernel when
        it returns, so a killed process loses nothing); at most :data:`MAX_OPEN_APPENDS` are
        kept open, and :meth:`delete` or :meth:`close` closes them.

        Raises:
            StorageError: not a local store, or the write failed.
        """
        if not self.is_local:
            raise StorageError(self.describe(), "append is only supported on a local disk")
        with self._appends_lock:
            handle = self._appends.pop(key, None)
            try:
                if handle is None:
                    handle = open(self._local(key), "ab", buffering=0)  # noqa: SIM115 - kept open
                view = memoryview(data)
                while view:
                    view = view[handle.write(view):]
            except OSError as exc:
                if handle is not None:
                    handle.close()
                raise StorageError(f"{self.describe()}/{key}", f"append failed: {exc}") from exc
            self._appends[key] = handle
            while len(self._appends) > MAX_OPEN_APPENDS:
                self._appends.popitem(last=False)[1].close()

    def close(self) -> None:
        """Close the files kept open for appends (the store stays usable)."""
        with self._appends_lock:
            while self._appends:
                self._appends.popitem()[1].close()

    def read_bytes(self, key: str) -> bytes:
        """Read the object at ``key``.

        Raises:
            FileNotFoundError: no such object.
            StorageError: the key is invalid or the read failed for another reason.
        """
        with self._errors(key, "read"):
            if self.is_local:
                with open(self._local(key), "rb") as handle:
                    return handle.read()
            return self.root.fs.cat_file(self.path(key).path)  # one GET (opening a file first asks its size)

    def exists(self, key: str) -> bool:
        """Whether an object (or folder) exists at ``key``."""
        if self.is_local:
            return os.path.exists(self._local(key))
        with self._errors(key, "existence check"):
            return self.path(key).exists()

    def list_names(self, prefix: str) -> list[str]:
        """Sorted names directly under ``prefix`` (empty when the prefix does not exist).

        Raises:
            StorageError: the URL's filesystem driver is not installed (s3fs for ``s3://``).
        """
        try:
            with self._errors(prefix, "listing", _NOT_THERE):
                return sorted(p.name for p in self.path(prefix).iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return []

    def list_folders(self, prefix: str) -> list[str]:
        """Sorted names of the folders directly under ``prefix`` (files left out; empty when it does not exist).

        On object stores a folder is a common key prefix: one listing request (s3fs adds one
        for the parent when the prefix holds nothing).

        Raises:
            StorageError: the key is invalid, the listing failed, or the URL's filesystem
                driver is not installed.
        """
        try:
            with self._errors(prefix, "listing", _NOT_THERE):
                if self.is_local:
                    with os.scandir(self._local(prefix)) as entries:
                        return sorted(e.name for e in entries if e.is_dir())
                listing = self.root.fs.ls(self.path(prefix).path, detail=True)
                return sorted(item["name"].rstrip("/").rsplit("/", 1)[-1] for item in listing
                              if item.get("type") == "directory")
        except (FileNotFoundError, NotADirectoryError):
            return []

    @contextlib.contextmanager
    def _errors(self, key: str, action: str, missing: tuple[type[OSError], ...] = (FileNotFoundError,)):
        """Raise what a store's client raises as :class:`StorageError` ("<location>: <action> failed: ...").

        A remote client refusing its endpoint (a ``ValueError`` before any request) is raised
        from :class:`InvalidEndpointError`, so :data:`CLIENT_HINTS` names ``AWS_ENDPOINT_URL``.

        ``missing`` (``FileNotFoundError``; for listings also ``NotADirectoryError``) passes
        through, so callers tell "not there" from "failed", as does a :class:`StorageError`;
        a missing driver becomes :meth:`_no_driver`'s error. On local disks only ``OSError``
        is translated; remote clients raise their own types too.
        """
        try:
            yield
        except (*missing, StorageError):
            raise
        except ImportError as exc:
            raise self._no_driver(exc) from exc
        except Exception as exc:
            if not self.is_local and isinstance(exc, ValueError) and "endpoint" in str(exc).lower():
                # The client refuses its endpoint before any request: say which setting to fix.
                raise self._error(key, f"{action} failed: {exc} ({CLIENT_HINTS['InvalidEndpointError']})") \
                    from InvalidEndpointError(str(exc))
            detail = self._failure_detail(exc)
            if detail is None:
                raise
            raise self._error(key, f"{action} failed: {detail}") from exc

    def _failure_detail(self, exc: Exception) -> str | None:
        """What to say of ``exc`` if it is a storage failure, else None (a bug: leave it be).

        An ``OSError`` is one; on remote stores so is an error of the client's own types
        (:data:`CLIENT_MODULES`), named with its class and :data:`CLIENT_HINTS`' advice.
        """
        if isinstance(exc, OSError):
            return str(exc)
        if self.is_local or type(exc).__module__.split(".")[0] not in CLIENT_MODULES:
            return None
        detail = f"{type(exc).__name__}: {exc}"
        if hint := CLIENT_HINTS.get(type(exc).__name__):
            detail += f" ({hint})"
        return detail

    def _error(self, key: str, message: str, cls: type[StorageError] = StorageError) -> StorageError:
        """A StorageError (or ``cls``) at ``key`` (the root itself when empty), knowing the root it is under."""
        error = cls(f"{self.describe()}/{key}" if key else self.describe(), message)
        error.root = self.describe()
        return error

    def _no_driver(self, exc: ImportError) -> StorageError:
        """The URL's filesystem driver (s3fs for ``s3://``) is not installed."""
        return StorageError(self.describe(), f"no filesystem driver for this URL: {exc} (for S3: pip install -e '.[s3]')")

    def delete(self, key: str) -> None:
        """Delete the object at ``key`` if it exists (closing it first if kept open for appends)."""
        with self._appends_lock:
            handle = self._appends.pop(key, None)
        if handle is not None:
            handle.close()
        try:
            with self._errors(key, "delete"):
                self.path(key).unlink()
        except FileNotFoundError:
            pass

    def list_files(self, prefix: str) -> list[tuple[str, int]]:
        """``(key, size in bytes)`` of every object under ``prefix``, recursively, sorted by key.

        Files whose names :func:`check_key` refuses are included (temp files left by
        crashes, ``.<name>.<hex>.tmp``; strays such as ``.DS_Store``): remove them with
        :meth:`delete_listed`. On object stores this is one listing request (fsspec
        ``find``), not one per object.

        Raises:
            StorageError: ``prefix`` is not a valid key, or the store listed a path outside it.
            OSError: a folder under ``prefix`` cannot be read (local disks).
        """
        check_key(prefix)
        if self.is_local:
            top, found = self._local(prefix), []

            def unreadable(exc: OSError) -> None:
                raise exc

            for folder, _, names in os.walk(top, onerror=unreadable):
                for name in names:
                    full = os.path.join(folder, name)
                    found.append((os.path.relpath(full, self._local_root).replace(os.sep, "/"), os.path.getsize(full)))
            return sorted(found)
        base = self.path(prefix).path.rstrip("/")
        found = []
        with self._errors(prefix, "listing"):
            listing = self.root.fs.find(base, detail=True)
        for name, info in listing.items():
            if info.get("type") == "directory":
                continue
            if not name.startswith(base + "/"):  # never turn a listing we do not understand into deletes
                raise self._error(prefix, f"listing returned {name!r}, outside {base!r}")
            found.append((f"{prefix}/{name[len(base) + 1:]}", int(info.get("size") or 0)))
        return sorted(found)

    def delete_listed(self, key: str) -> None:
        """Delete a file :meth:`list_files` returned, whatever its name (missing: no error).

        The folder part must be a valid key; the last part may be any file name (no ``/``,
        not ``.`` or ``..``), so nothing outside the root can be named.

        Raises:
            StorageError: the folder is not a valid key, or the name is empty, ``.`` or ``..``.
        """
        folder, _, name = key.rpartition("/")
        check_key(folder)
        if name in ("", ".", ".."):
            raise StorageError(key, "not a file name")
        if self.is_local:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self._local(folder), name))
            return
        with contextlib.suppress(FileNotFoundError), self._errors(key, "delete"):
            self.root.fs.rm_file(f"{self.path(folder).path.rstrip('/')}/{name}")

    def sweep_temp_files(self, prefix: str, *, names: Iterable[str] | None = None, prune: bool = False) -> int:
        """Remove temp files orphaned by a crash under ``prefix`` (recursively); return how many.

        Only sweep where no other process can be writing (hold the partition's lock for the
        stage that writes there).

        Args:
            names: only the temp files of these objects directly in ``prefix`` (e.g.
                ``["parsed.json"]``), for a folder that other stages write into too.
            prune: also remove folders left empty, ``prefix`` included.
        """
        if not self.is_local:
            return 0  # object stores write in one PUT: no temp files exist
        removed = 0
        folder = Path(self.path(prefix).path)
        if not folder.is_dir():
            return 0
        if names is None:
            orphans = list(folder.rglob(f".*{TEMP_SUFFIX}"))
        else:
            orphans = [item for name in names for item in folder.glob(f".{name}.*{TEMP_SUFFIX}")]
        for item in orphans:
            item.unlink(missing_ok=True)
            removed += 1
        if prune:
            for empty in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True) + [folder]:
                try:
                    empty.rmdir()
                except OSError:
                    pass  # not empty
        return removed


def _write_local_atomic(target: Path, data: bytes, *, sync_folder: bool = True) -> None:
    """temp file + fsync + rename (+ fsync of the folder): the POSIX durability recipe."""
    tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}{TEMP_SUFFIX}"
    try:
        try:
            handle = open(tmp, "wb")
        except FileNotFoundError:  # first object in this folder (no mkdir per write: it contends)
            _make_folders(target.parent)
            handle = open(tmp, "wb")
        with handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        crashpoint("storage.after_temp_write")
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    crashpoint("storage.after_replace")
    if sync_folder:
        _fsync_folder(target.parent)


def _make_folders(folder: Path) -> None:
    """``mkdir -p folder``, each folder made recorded in its parent durably (fsync of the
    parent): a file renamed into a new folder then survives a power loss with its path.

    A folder another writer made meanwhile has its parent fsynced here too, so this call
    does not return before its entry is durable. Limit: a writer whose first ``open`` found
    the folder already there does not wait for its maker's fsync (microseconds).

    Raises:
        FileExistsError: a component exists and is no folder (a file, a dangling symlink).
    """
    missing = []
    while not folder.exists():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for new in reversed(missing):
        try:
            new.mkdir()
        except FileExistsError:
            if not new.is_dir():  # a file or a dangling symlink: refused as mkdir -p refuses it
                raise
        _fsync_folder(new.parent)


def _fsync_folder(folder: Path) -> None:
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
