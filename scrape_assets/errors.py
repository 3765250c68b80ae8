"""Exceptions raised by scrape_assets.

Every exception carries the context needed to act on it (the file, key, URL or
partition it is about), so a log line alone tells the operator what to fix::

    ScrapeError                      base class; never raised itself
    ├── SpecError                    a site spec file is missing, malformed or invalid
    │   └── UnknownSiteError         a site name that is neither a shipped spec nor a file
    ├── SettingsError                an environment variable has a bad value
    ├── StorageError                 object storage unreachable, unwritable, or a key escapes the root
    ├── ManifestError                a manifest cannot be read or does not match its partition
    │   └── FetchConfigChangedError  resume refused: the frozen fetch config differs (not the pace)
    ├── PartitionLockedError         another run holds the partition's lock
    └── FetchError                   one page could not be fetched (carries url, attempts)
        ├── TransientFetchError      worth retrying: 5xx, 408, 429, timeout, connection error
        └── PermanentFetchError      not worth retrying: other 4xx, robots.txt, off-site redirect

``FetchError`` never escapes a run: the crawler records it in the manifest and the
dead letters. The others fail the step, so Dagster's ``RetryPolicy`` (or a person)
can act on them.
"""

from __future__ import annotations

import re


class ScrapeError(Exception):
    """Base class of every error raised by scrape_assets.

    Picklable with its attributes (an error raised in a parse worker process reaches the
    step as it was), although subclasses take other arguments than their message.
    """

    def __reduce__(self):
        return _restore_error, (type(self), self.args, self.__dict__)


def _restore_error(cls: type[ScrapeError], args: tuple, state: dict) -> ScrapeError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class SpecError(ScrapeError):
    """A site spec is missing, malformed or invalid.

    Attributes:
        source: the spec file path (or shipped spec name) that is wrong.
        key: dotted path of the offending key inside the spec, or ``None`` for the whole file.
    """

    def __init__(self, source: str, key: str | None, message: str):
        self.source = source
        self.key = key
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {message}")


class UnreadableFileError(SpecError):
    """A spec (or other YAML) file that cannot be read at all: missing, no permission, not UTF-8."""


class UnknownSiteError(SpecError):
    """A site reference that names no shipped spec and no spec file.

    Attributes:
        expected: what a valid reference looks like (the shipped names, or a path).
    """

    def __init__(self, source: str, expected: str):
        self.expected = expected
        super().__init__(source, None, f"unknown site: expected {expected}")


class SettingsError(ScrapeError):
    """An environment variable (``SCRAPE_*``) has a value that cannot be used."""

    def __init__(self, variable: str, value: str, expected: str):
        self.variable = variable
        super().__init__(f"{variable}={value!r} is invalid: expected {expected}")


class StorageError(ScrapeError):
    """Object storage cannot be used: unreachable, unwritable, or a key escapes the root.

    Attributes:
        location: the root or the object concerned, credentials removed.
        root: the store's root when ``location`` is an object under it (else None).
    """

    root: str | None = None

    def __init__(self, location: str, message: str):
        self.location = location
        super().__init__(f"{location}: {message}")


class MissingBucketError(StorageError):
    """The object store's bucket does not exist (S3's NoSuchBucket): no retry creates it."""


class ManifestError(ScrapeError):
    """A manifest cannot be read, or does not belong to the partition it was loaded for."""

    def __init__(self, location: str, message: str):
        self.location = location
        self.detail = message
        super().__init__(f"{location}: {message}")


#: A fetch config key missing on one side of :class:`FetchConfigChangedError`'s ``changes``.
ABSENT = "<absent>"


class FetchConfigChangedError(ManifestError):
    """Resuming an incomplete snapshot was refused because the fetch config changed (other
    than its pace: ``manifest.PACING_KEYS``).

    Attributes:
        differing_keys: the config keys whose values differ, sorted.
        changes: for keys in ``changes`` (given by the caller): ``(snapshot's value, current value)``,
            shown in the message (:data:`ABSENT`: the key is missing on that side). The caller
            redacts URLs (the message reaches logs and alerts).
    """

    def __init__(self, location: str, differing_keys: list[str], changes: dict[str, tuple] | None = None):
        self.differing_keys = differing_keys
        self.changes = dict(changes or {})
        moved = " or from another start URL (the spec moved the category)" if "start_url" in differing_keys else ""

        def shown(value) -> str:
            return "absent" if value is ABSENT else repr(value)

        keys = ", ".join(
            f"{key} (was {shown(self.changes[key][0])}, now {shown(self.changes[key][1])})" if key in self.changes
            else key for key in differing_keys
        )
        super().__init__(
            location,
            f"the incomplete snapshot was fetched with a different config{moved} "
            f"(differing keys: {keys}); restore the earlier settings to resume it, or "
            "start a new snapshot: run config `ops: {raw_pages: {config: {new_snapshot: true}}}` "
            "(the demo: `.venv/bin/scrape-assets demo --new-snapshot` in the clone)",
        )


class PartitionLockedError(ScrapeError):
    """Another run is writing the same partition."""

    def __init__(self, partition: str, holder: str):
        self.partition = partition
        self.holder = holder
        super().__init__(
            f"partition {partition!r} is being written by another run: {holder}; "
            "launch again when it has finished, or set SCRAPE_LOCK_WAIT_S to wait for it"
        )


class FetchError(ScrapeError):
    """One page could not be fetched.

    Attributes:
        url: the page URL.
        reason: short machine-readable reason (``http_503``, ``timeout``, ``robots_disallowed``...).
        http_status: the last HTTP status received, or ``None`` when no response arrived.
        retry_after_s: the server's ``Retry-After`` in seconds, when it sent one.
        attempts: HTTP attempts made on this page so far, counting attempts made by an
            interrupted earlier run (``0`` when the page was refused before any request,
            e.g. by robots.txt).
    """

    def __init__(
        self,
        url: str,
        reason: str,
        detail: str = "",
        http_status: int | None = None,
        retry_after_s: float | None = None,
        *,
        attempts: int = 0,
    ):
        self.url = url
        self.reason = reason
        self.detail = detail
        self.http_status = http_status
        self.retry_after_s = retry_after_s
        self.attempts = attempts
        super().__init__(f"{url}: {reason}" + (f" ({detail})" if detail else ""))

    @property
    def recorded_reason(self) -> str:
        """``reason: detail`` (``reason`` alone without a detail): what a manifest keeps as the
        page's ``last_error``, and its dead letter's reason."""
        return self.reason + (f": {self.detail}" if self.detail else "")


class TransientFetchError(FetchError):
    """A failure worth retrying (RFC 9110 5xx, 408, 429, timeouts, connection errors)."""


class PermanentFetchError(FetchError):
    """A failure not worth retrying (other 4xx, disallowed by robots.txt, off-site redirect)."""


#: ``<ssl.SSLContext object at 0x7f874bd18b00>``: a repr whose address differs in every process.
_OBJECT_AT = re.compile(r"<([\w.]+) object at 0x[0-9a-fA-F]+>")


def without_addresses(text: str) -> str:
    """``text`` with each ``<Type object at 0x...>`` as ``<Type object>``."""
    return _OBJECT_AT.sub(r"<\1 object>", text)


def exception_text(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` of ``exc`` on one line, for a manifest's ``last_error`` or a dead
    letter's reason: object addresses dropped (``<ssl.SSLContext object>``: the same failure
    reads the same in every run, so reasons group), at most ``limit`` characters."""
    text = " ".join(without_addresses(str(exc)).split())
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."

