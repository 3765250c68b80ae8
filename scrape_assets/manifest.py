"""Per-partition snapshot manifests: what was fetched, how, and how it went.

A *snapshot* is one crawl of one category (partition). Its objects live under a key a
person can read::

    {site}/{category}/{snapshot_id}/manifest.json
    {site}/{category}/{snapshot_id}/pages/page-0001.html
    {site}/{category}/{snapshot_id}/parsed.json          (written by parsed_products)
    {site}/{category}/{snapshot_id}/dead_letters.json    (written by dead_letters)

``snapshot_id`` is the UTC start time, ``YYYY-MM-DDTHHMMSSZ`` (``-1``, ``-2``, ... appended for
further snapshots in the same second); :func:`snapshot_sort_key` orders them by time.

The manifest (JSON) holds the frozen fetch config and its SHA-256 (a resume may change
only its pace, :data:`PACING_KEYS`, and records the config it goes on with), and for every page
its URL, status (``pending`` → ``done`` | ``failed``), attempts, HTTP status, content
hash, byte size, fetched time and last error. Every change of state is persisted
before the crawl moves on, so after a crash the manifest holds the previous state or
the next, and a new run resumes from it:

- structural changes (new snapshot, pages discovered, completion) rewrite
  ``manifest.json`` atomically (see :mod:`scrape_assets.storage`);
- a page's change of state is one line appended to ``manifest.journal`` next to it
  (local disk), each line carrying a sequence number; loading replays the lines newer
  than the file's ``journal_seq`` and ignores a torn last line. The journal is folded
  back into ``manifest.json`` (compaction) every :data:`COMPACT_EVERY` lines and at
  the end. This keeps a 10,000-page snapshot at O(1) work per change instead of
  rewriting the whole manifest. Appends are not fsynced: they survive a killed
  process (the kernel keeps them), and a power loss can lose at most the lines since
  the last compaction (those pages are fetched again).
- on object stores (no append), every change rewrites ``manifest.json`` with one PUT.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from typing import Literal

import orjson

from scrape_assets.content_type import header_charset
from scrape_assets.errors import ABSENT, FetchConfigChangedError, ManifestError, StorageError
from scrape_assets.storage import ObjectStore, check_key, redact_url

FORMAT_VERSION = 1
#: Fold the journal into manifest.json after this many lines.
COMPACT_EVERY = 1000
#: After a compaction failed (a full disk, say), try again after this many more lines.
COMPACT_RETRY_EVERY = 100
PageStatus = Literal["pending", "done", "failed"]
logger = logging.getLogger(__name__)


_ISO_SECONDS = "%Y-%m-%dT%H:%M:%SZ"


def utc_now_iso(now: datetime | None = None) -> str:
    """``now`` (default: the clock) in UTC, ISO 8601 with seconds and a ``Z`` suffix."""
    return (now or datetime.now(timezone.utc)).strftime(_ISO_SECONDS)


def retry_time(delay_s: float, now: datetime | None = None) -> str:
    """``delay_s`` seconds after ``now`` (default: the clock), as :func:`utc_now_iso` gives it,
    rounded up to the second: a :attr:`PageEntry.retry_at` is never earlier than asked."""
    until = (now or datetime.now(timezone.utc)) + timedelta(seconds=max(delay_s, 0.0))
    if until.microsecond:
        until += timedelta(microseconds=1_000_000 - until.microsecond)
    return utc_now_iso(until)


def seconds_until(when: str | None, now: datetime | None = None) -> float:
    """Seconds from ``now`` (default: the clock) to the UTC ISO 8601 time ``when``; 0 when
    ``when`` is ``None``, past, or not such a time (a hand-edited manifest waits for nothing)."""
    if not when:
        return 0.0
    try:
        moment = datetime.fromisoformat(when)
    except ValueError:
        return 0.0
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return max((moment - (now or datetime.now(timezone.utc))).total_seconds(), 0.0)


#: A snapshot folder's name: :func:`new_snapshot_id`'s, with ``-N`` for a later one in the same second.
SNAPSHOT_ID = re.compile(r"\d{4}-\d{2}-\d{2}T\d{6}Z(-\d+)?")


def new_snapshot_id(now: datetime | None = None) -> str:
    """A sortable snapshot id from the UTC time, e.g. ``2026-11-30T084512Z``."""
    return (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H%M%SZ")


def snapshot_sort_key(snapshot_id: str) -> tuple[str, int]:
    """Order of snapshot ids: by time, then by the ``-N`` suffix of same-second snapshots as a number.

    ``2026-11-30T084512Z`` -> ``("2026-11-30T084512Z", 0)``; ``...Z-10`` -> ``(..., 10)``, so
    ``-10`` sorts after ``-9`` (as text it would not).
    """
    base, dash, n = snapshot_id.partition("Z-")
    if dash and n.isascii() and n.isdigit():
        return f"{base}Z", int(n)
    return snapshot_id, 0


def config_hash(config: dict) -> str:
    """SHA-256 (hex) of the canonical JSON of a fetch config."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def differing_keys(old: dict, new: dict) -> list[str]:
    """Sorted keys whose values differ between two flat config dicts (missing counts as differing)."""
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


#: Fetch config keys that set only the pace of a crawl (``FetchPolicy`` fields): how fast and
#: how patiently pages are asked, not which pages or what they hold. A snapshot resumes under
#: other values of these (a rate lowered after a run of 429s, a longer timeout for a slow
#: site); any other key that differs refuses the resume (:class:`FetchConfigChangedError`).
PACING_KEYS = frozenset(
    {"requests_per_second", "max_concurrency", "timeout_s", "backoff_base_s", "backoff_max_s", "retry_after_max_s"}
)


def fetch_identity(config: dict) -> dict:
    """``config`` without its :data:`PACING_KEYS`: what must be equal for a snapshot to resume."""
    return {k: v for k, v in config.items() if k not in PACING_KEYS}


def pace_changes(old: dict, new: dict) -> dict[str, tuple]:
    """``{key: (old value, new value)}`` of the :data:`PACING_KEYS` whose values differ."""
    return {k: (old.get(k), new.get(k)) for k in sorted(PACING_KEYS) if old.get(k) != new.get(k)}


@dataclass
class PageEntry:
    """One listing page of a snapshot.

    Attributes:
        url: absolute URL fetched.
        status: ``pending`` (not yet fetched, or in flight when a run died), ``done`` or ``failed``.
        attempts: HTTP attempts made so far, across runs.
        http_status: last HTTP status, ``None`` when no response arrived.
        content_hash: ``sha256:<hex>`` of the stored body (``done`` only).
        bytes: stored body size in bytes.
        fetched_at: UTC ISO 8601 time of the request that last fetched or confirmed the page
            (a 304 or the same bytes move it; an adopted page keeps its copy's): how fresh the
            saved copy is known to be (``incremental.max_days_without_request``, sitemap dates).
        last_error: reason of the last failure, e.g. ``http_404`` or ``timeout: ...``.
        content_type, etag, last_modified: response headers kept for parsing and conditional GET.
        body_key: where the body is stored when it is not this snapshot's own page key: an
            earlier snapshot's object, reused because the server answered 304 Not Modified
            or the body's hash was unchanged (nothing stored twice).
        not_modified: the server answered 304 to a conditional GET (RFC 9110 §15.4.5).
        assumed_unchanged: adopted from the previous snapshot without a request, because
            page 1 was unchanged and the spec says ``incremental.revalidate: first_page``, or
            the site's sitemap dates the page no later than its saved copy (``sitemap``).
        final_url: the URL that answered after same-origin redirects, when it is not
            ``url`` (a category moved with a 301): the page's relative links are resolved
            against it, as a browser does. ``None`` when the page was not redirected.
        retry_at: while a ``pending`` page waits between attempts: the UTC ISO 8601 time
            (rounded up to the second) before which it is not asked again, from its last
            failure's back-off or ``Retry-After`` (RFC 9110 §10.2.3); a run resuming the
            snapshot waits until then. ``last_error`` and ``http_status`` then describe
            that failure. ``None`` otherwise.
        failed_at: UTC ISO 8601 time the page was recorded ``failed`` (its dead letter's
            ``recorded_at``); ``None`` for other pages.
        body_fetched_at: when the body reused from an earlier snapshot (``body_key``) was first
            fetched (UTC ISO 8601), carried from snapshot to snapshot while the page stays
            unchanged; ``None`` when the body was fetched at ``fetched_at`` (or the entry was
            written by a version before this field). Products parsed from the page carry
            :attr:`body_fetched_time`.
        meta_charset: when ``content_type`` names no charset, the codec other than UTF-8 the
            body's own ``<meta>`` declares (``parsing.meta_declared_codec``: what decodes it);
            ``None`` otherwise, or for an entry written by a version before this field.
    """

    url: str
    status: PageStatus = "pending"
    attempts: int = 0
    http_status: int | None = None
    content_hash: str | None = None
    bytes: int | None = None
    fetched_at: str | None = None
    last_error: str | None = None
    content_type: str | None = None
    etag: str | None = None
    last_modified: str | None = None
    body_key: str | None = None
    not_modified: bool = False
    assumed_unchanged: bool = False
    final_url: str | None = None
    retry_at: str | None = None
    failed_at: str | None = None
    body_fetched_at: str | None = None
    meta_charset: str | None = None

    @property
    def body_fetched_time(self) -> str | None:
        """When the body the page reads was fetched (UTC ISO 8601): a 304 or an unchanged
        re-fetch does not move it."""
        return self.body_fetched_at or self.fetched_at


_ENTRY_FIELDS = tuple(f.name for f in fields(PageEntry))
_OPTIONAL_FIELDS = ("final_url", "retry_at", "failed_at", "body_fetched_at", "meta_charset")  # written only when set
_ENTRY_FIELD_SET = frozenset(_ENTRY_FIELDS)


def _page_entry(data: dict) -> PageEntry:
    """A page entry from its JSON object; keys of a later version's fields are ignored (a
    missing ``url`` still raises ``TypeError``)."""
    if data.keys() <= _ENTRY_FIELD_SET:
        return PageEntry(**data)
    return PageEntry(**{k: v for k, v in data.items() if k in _ENTRY_FIELD_SET})


def _charset_mark(entry: PageEntry) -> str:
    """``";<charset>"`` for a ``Content-Type`` declaring a charset other than UTF-8;
    ``";meta:<codec>"`` for one declaring none on a page whose ``<meta>`` names a codec other
    than UTF-8 (:attr:`PageEntry.meta_charset`: then the ``<meta>`` decides, where a header's
    ``charset=utf-8`` would not); else ``""``."""
    charset = (header_charset(entry.content_type) or "").lower()
    if not charset:
        return f";meta:{entry.meta_charset}" if entry.meta_charset else ""
    return "" if charset in ("utf-8", "utf8") else f";{charset}"


def _entry_dict(entry: PageEntry) -> dict:
    """The entry's fields as a dict (what ``dataclasses.asdict`` gives, without its deep copies).

    ``final_url``, ``retry_at``, ``failed_at``, ``body_fetched_at`` and ``meta_charset`` only
    when set (a redirected page, a page between two attempts, a failed page, a body reused
    from an earlier snapshot, a ``<meta>`` charset other than UTF-8 deciding). A version
    that predates a field cannot read an entry holding it (its ``PageEntry(**entry)`` refuses the key): rolling back past the
    version that added ``retry_at`` and ``failed_at`` needs the snapshots made since set
    aside. :func:`_page_entry` ignores keys it does not know, so later fields do not stop
    this version.
    """
    out = {name: getattr(entry, name) for name in _ENTRY_FIELDS}
    for optional in _OPTIONAL_FIELDS:
        if out[optional] is None:
            del out[optional]
    return out


def _json_kind(value: object) -> str:
    """How JSON calls ``value``'s type (for messages about a file's shape)."""
    if isinstance(value, dict):
        return "an object" + (" holding a non-object entry" if any(not isinstance(v, dict) for v in value.values()) else "")
    return {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), "null" if value is None else type(value).__name__)


@dataclass
class Manifest:
    """The state of one snapshot of one partition (see module docstring)."""

    site: str
    category: str
    snapshot_id: str
    fetch_config: dict
    fetch_config_hash: str
    start_url: str
    created_at: str = field(default_factory=utc_now_iso)
    updated_at: str = field(default_factory=utc_now_iso)
    completed_at: str | None = None
    discovery_complete: bool = False
    total_pages: int | None = None
    products_expected: int | None = None
    pages: dict[int, PageEntry] = field(default_factory=dict)
    run_id: str | None = None  # the (Dagster) run that last opened this snapshot
    journal_seq: int = 0  # last journal line folded into manifest.json
    format: int = FORMAT_VERSION

    # -- keys -------------------------------------------------------------------------
    @property
    def prefix(self) -> str:
        """Storage prefix of this snapshot's objects."""
        return snapshot_prefix(self.site, self.category, self.snapshot_id)

    @property
    def key(self) -> str:
        """Storage key of ``manifest.json``."""
        return f"{self.prefix}/manifest.json"

    @property
    def journal_key(self) -> str:
        """Storage key of ``manifest.journal`` (page state changes since the last full save)."""
        return f"{self.prefix}/manifest.journal"

    def page_key(self, page_number: int) -> str:
        """Storage key of a page body: ``.../pages/page-0001.html``."""
        return f"{self.prefix}/pages/page-{page_number:04d}.html"

    def body_key(self, page_number: int) -> str:
        """Where page ``page_number``'s body is: its own key, or an earlier snapshot's (unchanged page)."""
        return self.pages[page_number].body_key or self.page_key(page_number)

    @property
    def sees_every_page(self) -> bool:
        """True when every page entry is ``done``: the snapshot saw every product of its category.

        When False (a page failed, or discovery stopped at a failed page), ``products_table``
        carries forward the earlier rows of products this snapshot did not see.
        """
        return all(p.status == "done" for p in self.pages.values())

    @property
    def data_version(self) -> str:
        """SHA-256 over (page number, content hash) of done pages: equal iff the content is equal.

        A redirected page's ``final_url`` counts too (its links are resolved against it), and
        so does a charset its ``Content-Type`` declares other than UTF-8 (the same bytes read
        otherwise: a site that corrects its label changes the version), or, without one, a
        ``<meta>`` charset other than UTF-8 (``meta_charset``: adding ``charset=utf-8`` to
        the header then changes how the page reads). For pages never redirected and read as
        UTF-8, the version is what it was before those counted.
        """
        parts = [f"{n}:{p.content_hash}" + (f"@{p.final_url}" if p.final_url else "") + _charset_mark(p)
                 for n, p in sorted(self.pages.items()) if p.status == "done"]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]

    # -- state --------------------------------------------------------------------------
    def created_datetime(self) -> datetime:
        """``created_at`` as an aware UTC datetime."""
        return datetime.strptime(self.created_at, _ISO_SECONDS).replace(tzinfo=timezone.utc)

    @property
    def is_complete(self) -> bool:
        """Every page discovered has ended ``done`` or ``failed`` and the crawl finished."""
        return self.completed_at is not None

    def counts(self) -> dict[str, int]:
        """Pages by status, plus ``attempts`` summed over pages."""
        out = {"pending": 0, "done": 0, "failed": 0, "attempts": 0}
        for entry in self.pages.values():
            out[entry.status] += 1
            out["attempts"] += entry.attempts
        return out

    def to_json(self) -> bytes:
        """The manifest as UTF-8 JSON, readable and diffable by hand: one field per line, one
        page entry per line (keyed by page number as a string, in page order; an entry's
        fields in declaration order).
        """
        # Built line by line. The page entries (str, int, bool, None only) through orjson: a
        # 10,000-page snapshot is saved several times a run, and json.dumps per entry was ~3x
        # slower. The few head fields through json, which keeps what orjson would change
        # silently (a non-finite float in fetch_config, e.g. timeout_s=inf, as Infinity).
        lines = [
            b' "%s": %s' % (name.encode(), json.dumps(getattr(self, name), sort_keys=True, separators=(",", ":")).encode())
            for name in _HEAD_FIELDS
        ]
        pages = b",\n".join(b'  "%d": %s' % (n, _dumps(_entry_dict(p))) for n, p in sorted(self.pages.items()))
        lines.append(b' "pages": {\n%s\n }' % pages if pages else b' "pages": {}')
        return b"{\n" + b",\n".join(lines) + b"\n}"

    @classmethod
    def from_json(cls, raw: bytes, location: str) -> Manifest:
        """Parse a manifest.

        Raises:
            ManifestError: not JSON, a different format version, or missing fields.
        """
        try:
            data = _loads(raw)
            if not isinstance(data, dict):
                raise ManifestError(location, f"unreadable manifest: expected a JSON object, got {_json_kind(data)}")
            if data.get("format") != FORMAT_VERSION:
                raise ManifestError(location, f"format {data.get('format')!r}, expected {FORMAT_VERSION}")
            if "pages" not in data:
                raise ManifestError(location, "unreadable manifest: the `pages` key is missing")
            pages = data.pop("pages")
            if not isinstance(pages, dict) or not all(isinstance(p, dict) for p in pages.values()):
                raise ManifestError(location, "unreadable manifest: expected `pages` to be an object of page number -> "
                                              f"entry object, got {_json_kind(pages)}")
            pages = {int(n): _page_entry(p) for n, p in pages.items()}
            return cls(pages=pages, **data)
        except ManifestError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ManifestError(location, f"unreadable manifest: {exc}") from exc

    def save(self, store: ObjectStore) -> None:
        """Write the whole manifest atomically (temp + fsync + rename locally; one PUT on S3).

        Lines already in the journal are folded in; the journal is then removed (a crash
        in between is harmless: its lines are not newer than ``journal_seq``).
        """
        self.updated_at = utc_now_iso()
        store.write_bytes_atomic(self.key, self.to_json())
        self._journal_lines = 0
        if store.is_local:
            store.delete(self.journal_key)
        self._journal_torn = False

    def record(self, store: ObjectStore, page_number: int) -> None:
        """Persist page ``page_number``'s current state (one journal line, or a full save remotely).

        After a torn journal (an append that failed part way, say on a full disk, or a torn
        last line found when loading) the next change is a full save instead: a line
        appended after a torn one would be glued to it.

        Raises:
            StorageError: the change was not persisted (its append or its full save failed).
                A failed compaction after a line that was appended is not raised: the change
                is in the journal; it is logged and tried again :data:`COMPACT_RETRY_EVERY`
                lines later (a storage that stays broken fails the snapshot's next full save).
        """
        if not store.is_local or getattr(self, "_journal_torn", False):
            self.save(store)
            return
        self.journal_seq += 1
        line = {"seq": self.journal_seq, "page": page_number, "entry": _entry_dict(self.pages[page_number])}
        try:
            store.append_bytes(self.journal_key, _journal_line(line))
        except BaseException:
            self._journal_torn = True  # some of the line may be in the file
            raise
        self._journal_lines = getattr(self, "_journal_lines", 0) + 1
        if self._journal_lines >= COMPACT_EVERY:
            try:
                self.save(store)
            except StorageError as exc:
                # Raised, it would make the caller undo in memory a change already on disk (an
                # attempt counted in the journal but never sent, read back on resume).
                self._journal_lines = COMPACT_EVERY - COMPACT_RETRY_EVERY
                logger.warning("%s: compaction failed, the journal keeps every change (trying again after "
                               "%d more lines): %s", self.key, COMPACT_RETRY_EVERY, exc)

    def replay_journal(self, raw: bytes, location: str) -> None:
        """Apply journal lines newer than ``journal_seq``; a torn line is ignored.

        A line is torn when an append stopped part way (a killed process, a full disk): the
        change it carried never completed, so the state before it is what happened. A torn
        last line (any text after the last newline, even text that parses) is skipped; a
        torn line that a later append was glued to (written by a version before the fix in
        :meth:`record`) loses only its torn part: the line glued after it starts at its last
        ``{"seq":``, which no JSON string can hold unescaped.

        Raises:
            ManifestError: a line other than the last is not valid and no line follows a torn part.
        """
        lines = raw.split(b"\n")
        if lines.pop():
            # No newline after the last line: its append stopped before its end (a crash, a full
            # disk), even if what it wrote parses (all but the newline); its caller was told
            # it failed. Skipped, and the next change saves in full rather than glue a line to it.
            self._journal_torn = True
        for i, line in enumerate(lines):
            if not line:
                continue
            try:
                record = _loads(line)
                seq, n, entry = int(record["seq"]), int(record["page"]), _page_entry(record["entry"])
            except (ValueError, TypeError, KeyError) as exc:
                glued = line.rfind(b'{"seq":')
                try:
                    if glued <= 0:
                        raise ValueError("no line glued after a torn one")
                    record = _loads(line[glued:])
                    seq, n, entry = int(record["seq"]), int(record["page"]), _page_entry(record["entry"])
                except (ValueError, TypeError, KeyError):
                    raise ManifestError(location, f"journal line {i + 1} unreadable: {exc}") from exc
            if seq > self.journal_seq:
                self.pages[n] = entry
                self.journal_seq = seq


_HEAD_FIELDS = tuple(f.name for f in fields(Manifest) if f.name != "pages")
#: ``latest=`` of :func:`open_snapshot` and :func:`resume_conflict` when the caller has not
#: read the partition's latest snapshot: they read it themselves.
UNREAD = object()


def _dumps(value: dict) -> bytes:
    """Compact JSON (RFC 8259, UTF-8) of a page entry or a journal line (str, int, bool and
    None values, no floats): orjson (~1 us; ``json.dumps`` ~10 us, and a page costs several),
    or ``json.dumps`` for what orjson refuses (a lone surrogate in an error message, which
    json escapes as ``\\udXXX``)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":")).encode("utf-8")


def _loads(raw: bytes) -> object:
    """Parse JSON: orjson, or ``json.loads`` for what orjson refuses (an escaped lone surrogate,
    as :func:`_dumps` may write). Raises ValueError when neither can parse it."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _journal_line(line: dict) -> bytes:
    """One journal line: :func:`_dumps` ending in ``\\n`` (two per page)."""
    return _dumps(line) + b"\n"


def snapshot_prefix(site: str, category: str, snapshot_id: str) -> str:
    """``{site}/{category}/{snapshot_id}``, validated as a storage key (raises StorageError)."""
    prefix = f"{site}/{category}/{snapshot_id}"
    check_key(prefix)
    return prefix


def has_snapshot(store: ObjectStore, site: str) -> Callable[[str, str], bool]:
    """``(category, snapshot_id) -> bool``: whether that snapshot of ``site`` has a manifest in ``store``."""

    def check(category: str, snapshot_id: str) -> bool:
        try:
            prefix = snapshot_prefix(site, category, snapshot_id)
        except StorageError:  # not even a valid key: not one of ours
            return False
        return store.exists(f"{prefix}/manifest.json")  # a storage failure is raised, not taken for "no"

    return check


def list_snapshots(store: ObjectStore, site: str, category: str) -> list[str]:
    """Snapshot ids of a partition that have a manifest, oldest first (:func:`snapshot_sort_key`).

    One listing of the partition's folder, then one existence check per snapshot folder;
    folders whose names are not snapshot ids (:data:`SNAPSHOT_ID`: a NAS's ``@eaDir``, a
    copy made by hand) are not ours and left out.
    """
    return [n for n in snapshot_folders(store, site, category)
            if store.exists(f"{site}/{category}/{n}/manifest.json")]


def snapshot_folders(store: ObjectStore, site: str, category: str) -> list[str]:
    """Folders of a partition named like snapshots (:data:`SNAPSHOT_ID`), with a manifest or not, oldest first.

    Order: :func:`snapshot_sort_key`. One listing of the partition's folder.
    """
    check_key(f"{site}/{category}")
    return sorted((n for n in store.list_folders(f"{site}/{category}") if SNAPSHOT_ID.fullmatch(n)),
                  key=snapshot_sort_key)


def load_manifest(store: ObjectStore, site: str, category: str, snapshot_id: str) -> Manifest:
    """Load one snapshot's manifest.

    Raises:
        ManifestError: missing, unreadable, or recorded for another site/category.
    """
    manifest = _read_manifest(store, site, category, snapshot_id)
    if manifest is None:
        key = f"{snapshot_prefix(site, category, snapshot_id)}/manifest.json"
        raise ManifestError(key, "no manifest: this snapshot does not exist")
    return manifest


def _read_manifest(store: ObjectStore, site: str, category: str, snapshot_id: str) -> Manifest | None:
    """:func:`load_manifest`, with None for a snapshot folder that has no manifest."""
    key = f"{snapshot_prefix(site, category, snapshot_id)}/manifest.json"
    try:
        manifest = Manifest.from_json(store.read_bytes(key), key)
    except FileNotFoundError:
        return None
    except ManifestError as exc:
        raise ManifestError(key, f"{exc.detail}; restore it, or {_move_away(store, category)}") from exc
    if store.is_local:
        try:
            manifest.replay_journal(store.read_bytes(manifest.journal_key), manifest.journal_key)
        except FileNotFoundError:
            pass
        except ManifestError as exc:
            raise ManifestError(exc.location, f"{exc.detail}; {_move_away(store, category)}") from exc
    if (manifest.site, manifest.category, manifest.snapshot_id) != (site, category, snapshot_id):
        raise ManifestError(key, f"manifest belongs to {manifest.site}/{manifest.category}/{manifest.snapshot_id} "
                                 f"(a folder copied in?); {_move_away(store, category)}")
    return manifest


def _move_away(store: ObjectStore, category: str) -> str:
    """What to do about a snapshot whose manifest or journal cannot be used (damaged, of another
    version, copied in): the way out that loses nothing."""
    return (f"move its folder out of {store.describe()}: {category} then goes on from its previous complete "
            "snapshot, or crawls anew")


def latest_manifest(store: ObjectStore, site: str, category: str, *, complete: bool = False) -> Manifest | None:
    """The newest snapshot's manifest of a partition (the newest *complete* one if asked), or None.

    Reads manifests newest first, so usually one listing and one read (on S3: two requests,
    however many snapshots are kept; one more read per newer incomplete snapshot with
    ``complete=True``); a snapshot folder without a manifest is passed over, as are folders
    not named like snapshots (see :func:`list_snapshots`).
    """
    for snapshot_id in reversed(snapshot_folders(store, site, category)):
        manifest = _read_manifest(store, site, category, snapshot_id)
        if manifest is not None and (manifest.is_complete or not complete):
            return manifest
    return None


def open_snapshot(
    store: ObjectStore,
    *,
    site: str,
    category: str,
    start_url: str,
    fetch_config: dict,
    new_snapshot: bool = False,
    now: datetime | None = None,
    run_id: str | None = None,
    adopt_complete: Callable[[Manifest], bool] | None = None,
    resume_max_age: timedelta | None = None,
    on_abandon: Callable[[Manifest], None] | None = None,
    latest: Manifest | None | object = UNREAD,
    reexecuted_run_ids: Collection[str] = (),
    on_repace: Callable[[Manifest, dict[str, tuple]], None] | None = None,
) -> tuple[Manifest, bool]:
    """Resume the partition's incomplete snapshot, or start a new one.

    Args:
        fetch_config: the frozen fetch config (JSON-serialisable, flat) of this run.
        new_snapshot: start a new snapshot even if the latest one is incomplete with another
            config; except that a snapshot this run opened (``run_id``, or one of
            ``reexecuted_run_ids``; same config) is resumed or adopted as usual: a retry of
            the step, or a re-execution of the run from failure, continues what was fetched.
        reexecuted_run_ids: the runs this one re-executes (Dagster's parent and root run ids).
        on_repace: called with an incomplete snapshot about to be resumed at another pace
            (:data:`PACING_KEYS` differing) and ``{key: (was, now)}``, before its manifest
            records ``fetch_config`` as it is now (for a log line).
        now: the current time (UTC; default: the clock), for the new snapshot's id and the age below.
        resume_max_age: an incomplete snapshot created longer ago than this is not resumed
            (its pages would be dated by its start, possibly days ago): it is left as it is,
            and a new snapshot starts. None: resume at any age.
        on_abandon: called with such a snapshot before the new one starts (for a log line).
        run_id: the run opening the snapshot, recorded in the manifest as ``run_id``.
        adopt_complete: asked about the latest snapshot when it is *complete* and has this
            run's fetch config; True resumes it as it is (nothing left to fetch) instead of
            starting a new one. ``raw_pages`` says True for a snapshot completed by a run
            that died before recording it, so a restart does not fetch it all again. Not
            when it was created longer ago than ``resume_max_age`` (a run killed yesterday
            must not stand for today's pages): ``on_abandon`` is told, and a new one starts.
        latest: the partition's latest snapshot (:func:`latest_manifest`, None for none) when
            the caller has just read it and nothing can have written the partition since
            (``raw_pages`` holds its lock): saves reading it again, a GET on remote storage.
            By default it is read here.

    Returns:
        ``(manifest, resumed)``; a new manifest is saved before it is returned, a resumed
        incomplete one when its ``run_id`` changes.

    Raises:
        FetchConfigChangedError: the latest snapshot is incomplete, was fetched with a
            different config (other than its pace: :data:`PACING_KEYS`) or from another
            ``start_url``, and ``new_snapshot`` is false. Lists the differing keys
            (``start_url`` among them for the latter).
    """
    digest = config_hash(fetch_config)
    identity = fetch_identity(fetch_config)
    now = now or datetime.now(timezone.utc)
    if latest is UNREAD:
        latest = latest_manifest(store, site, category)
    if new_snapshot and run_id is not None and latest is not None and fetch_identity(latest.fetch_config) == identity \
            and (latest.run_id == run_id or latest.run_id in reexecuted_run_ids):
        new_snapshot = False  # this launch's own new snapshot: a step retry or a re-execution goes on with it
    if _too_old_to_resume(latest, now, resume_max_age):
        if on_abandon is not None:
            on_abandon(latest)
        new_snapshot = True
    if latest is not None and not latest.is_complete and not new_snapshot:
        refusal = _resume_refusal(latest, fetch_config, now, resume_max_age, start_url)
        if refusal is not None:
            raise refusal
        return _reopen(store, latest, run_id, fetch_config, on_repace), True
    if latest is not None and not new_snapshot and adopt_complete is not None:
        if fetch_identity(latest.fetch_config) == identity and adopt_complete(latest):
            if not _older_than(latest, now, resume_max_age):
                return latest, True  # complete: left as it is (its run_id names the run that completed it)
            if on_abandon is not None:  # its pages are as old as its start: today's run fetches today's
                on_abandon(latest)
    snapshot_id = new_snapshot_id(now)
    if latest is not None and snapshot_sort_key(snapshot_id) <= snapshot_sort_key(latest.snapshot_id):
        snapshot_id = _after(latest.snapshot_id)
    manifest = Manifest(
        site=site,
        category=category,
        snapshot_id=snapshot_id,
        fetch_config=fetch_config,
        fetch_config_hash=digest,
        start_url=start_url,
        created_at=utc_now_iso(now),
        pages={1: PageEntry(url=start_url)},
        run_id=run_id,
    )
    manifest.save(store)
    return manifest, False


def _older_than(manifest: Manifest, now: datetime, max_age: timedelta | None) -> bool:
    """Whether ``manifest``'s snapshot was created more than ``max_age`` before ``now`` (None: never)."""
    return max_age is not None and now - manifest.created_datetime() > max_age


def _too_old_to_resume(latest: Manifest | None, now: datetime, resume_max_age: timedelta | None) -> bool:
    return latest is not None and not latest.is_complete and _older_than(latest, now, resume_max_age)


def resume_conflict(
    store: ObjectStore, *, site: str, category: str, fetch_config: dict, now: datetime | None = None,
    resume_max_age: timedelta | None = None, latest: Manifest | None | object = UNREAD, start_url: str | None = None,
) -> FetchConfigChangedError | None:
    """The error :func:`open_snapshot` would raise for this partition (without ``new_snapshot``), or None.

    Reads only: a run asks it for every partition before opening any snapshot, so a
    changed config stops the run before it starts snapshots under the new config for the
    other partitions (which would then refuse the old config in turn). ``latest``: as in
    :func:`open_snapshot` (the caller's read of the latest snapshot, else read here).
    ``start_url``: the category's start URL now (the spec's); None: not compared.
    """
    if latest is UNREAD:
        latest = latest_manifest(store, site, category)
    return _resume_refusal(latest, fetch_config, now or datetime.now(timezone.utc), resume_max_age, start_url)


def _resume_refusal(
    latest: Manifest | None, fetch_config: dict, now: datetime, resume_max_age: timedelta | None,
    start_url: str | None = None,
) -> FetchConfigChangedError | None:
    """The one rule: an incomplete snapshot young enough to resume, fetched with another config
    or from another start URL (the spec moved the category: its pages are another listing's)."""
    if latest is None or latest.is_complete or _too_old_to_resume(latest, now, resume_max_age):
        return None
    moved = start_url is not None and latest.start_url != start_url
    keys = differing_keys(fetch_identity(latest.fetch_config), fetch_identity(fetch_config))
    if not keys and not moved:
        return None
    def value(config: dict, key: str):
        if key not in config:
            return ABSENT
        return redact_url(config[key]) if key.endswith("_url") and isinstance(config[key], str) else config[key]

    changes = {key: (value(latest.fetch_config, key), value(fetch_config, key)) for key in keys}
    if moved:  # the message reaches logs and alerts: redacted as any URL
        changes["start_url"] = (redact_url(latest.start_url), redact_url(start_url))
    for key, (was, now) in changes.items():
        if was == now:  # URLs differing only in what redact_url hides (user info, a query, or all of it)
            changes[key] = (was, f"{now} (differs where it is not shown)")
    return FetchConfigChangedError(latest.key, sorted(changes), changes)  # every differing key has its change


def _reopen(store: ObjectStore, manifest: Manifest, run_id: str | None, fetch_config: dict,
            on_repace: Callable[[Manifest, dict[str, tuple]], None] | None) -> Manifest:
    """``manifest`` resumed by ``run_id`` at ``fetch_config``'s pace: saved when either changes it."""
    changed = False
    if run_id is not None and manifest.run_id != run_id:
        manifest.run_id, changed = run_id, True
    if manifest.fetch_config != fetch_config:  # the pace only (_resume_refusal passed it): recorded as it is now
        if on_repace is not None and (paces := pace_changes(manifest.fetch_config, fetch_config)):
            on_repace(manifest, paces)
        manifest.fetch_config, manifest.fetch_config_hash, changed = fetch_config, config_hash(fetch_config), True
    if changed:
        manifest.save(store)
    return manifest


def _after(snapshot_id: str) -> str:
    """A snapshot id sorting just after ``snapshot_id`` (two runs in the same second)."""
    base, _, n = snapshot_id.partition("Z-")
    return f"{base}Z-{int(n or 0) + 1}" if n else f"{snapshot_id}-1"
