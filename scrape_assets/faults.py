"""Fault injection for the demo server: a small spec of what goes wrong, applied over real sockets.

``scrape-assets serve-demo --faults FILE`` serves the demo catalogue (:mod:`scrape_assets.demo_site`)
through :class:`FaultyDemoRequestHandler`, which breaks chosen responses the way real sites and
networks do. The tests (``scrape_assets_tests/test_faults.py``) run the pipeline through Dagster
against it; :func:`make_fault_server` builds one in-process.

Spec format (YAML or JSON; unknown keys are errors)::

    rules:                       # first rule that matches the path and is still active wins
      - match: 'mystery_3/page-2\\.html$'   # regex, searched in the request path (query ignored)
        fault: http_error
        status: 503
        first_n: 2               # only the first 2 requests of each matching path; omit: always
        retry_after_s: 1         # optional Retry-After on an http_error
      - match: 'travel_2/'
        fault: http_429
        retry_after_s: 2
        retry_after_form: http-date   # or seconds (the default)
      - fault: robots_disallow   # acts on /robots.txt (its default match)
        prefix: /catalogue/category/books/classics_6/
    rates:                       # optional: random faults, reproducible from the seed
      seed: 7
      match: '^/catalogue/'      # paths the rates apply to (default: every listing page)
      http_error: 0.10           # probability per request; drawn per (seed, path, attempt)
      reset_mid_body: 0.05

Fault kinds and their options (every rule also takes ``match`` and ``first_n``)::

    http_error           status (400..599, default 503), retry_after_s, retry_after_form
    http_429             retry_after_s (default 1; null: no header), retry_after_form
                         Retry-After (RFC 9110 §10.2.3) as delay-seconds (a fraction is sent as
                         is, a leniency the fetcher accepts) or as an HTTP-date rounded up to the
                         next second, so it never asks for less than retry_after_s
    reset_mid_body       after_bytes (default: half the body): then TCP RST (SO_LINGER 0)
    short_body           send_bytes (default: half the body): fewer than Content-Length, then FIN
    trickle              bytes_per_s (default 1000), interval_s (default 0.05): every read gets
                         data quickly, but the body takes size / bytes_per_s seconds (a 16-40 KB
                         demo page: 16-40 s at the default, within the fetcher's 60 s deadline
                         of a whole request; 200 B/s exceeds it); sent with Connection: close,
                         as the connection closes after it
    stall_after_headers  max_stall_s (default 60): headers, then nothing until the client hangs up,
                         the server stops or max_stall_s passes
    bad_gzip             Content-Encoding: gzip on a body that is not gzip
    oversize_body        body_bytes (default 10_000_001: one more than the fetcher's default
                         max_body_bytes), declare_length (default true; false: no Content-Length,
                         the body ends when the connection closes)
    gzip_bomb            decompressed_bytes (default 20_000_000) from a gzip body of a few KB
    redirect_loop        status (default 302): path -> path?loop=1 -> path -> ...
    redirect_offsite     status (default 302), location (default http://offsite.scrape-assets.invalid/):
                         redirect to the same path on another host
    charset_missing      no charset in Content-Type, and the page's <meta charset> removed
    charset_wrong        declared (default iso-8859-1): Content-Type claims it, body stays UTF-8
    layout_changed       the price element's class renamed (price_color -> price price--current)
    zero_products        every product card removed; keep_counts (default true) keeps the pager
                         and results count (a broken page); false also says "0 results" (an
                         honestly empty category)
    robots_disallow      prefix: an extra "Disallow: <prefix>" in robots.txt

The content kinds (charset_*, layout_changed, zero_products) and robots_disallow are the page
as the site changed it, with an ETag of its own (charset_wrong: same bytes, another
Content-Type, another tag): a conditional GET with the original page's validators gets the
changed page (200), one with the changed page's ETag gets 304 (RFC 9110 §13.1.2);
If-Modified-Since alone always gets the page. The transport and body kinds (reset_mid_body,
short_body, trickle, stall_after_headers, bad_gzip, oversize_body, gzip_bomb) break the full
200 answer even when the request is conditional: a 304 has no body to break.

Attempts are counted by the server, per path (query ignored), over its lifetime: the first
request of a path is attempt 1. ``rates`` only draw for requests no rule claimed; a draw is a
pure function of ``(seed, path, attempt)``, so the same crawl meets the same faults. Kinds drawn
by rates use their default options (``robots_disallow`` cannot be drawn).

The server logs every request twice: :attr:`DemoServer.requests` (as the plain demo server does)
and :attr:`FaultyDemoServer.fault_log` (:class:`FaultEvent`: attempt number, fault applied,
status and Retry-After sent, monotonic times), enough for :func:`retry_after_waits` to measure
how long a client waited after being told to. Handler threads are daemons, and stalls and
trickles end when the server shuts down or the client hangs up.
"""

from __future__ import annotations

import email.utils
import functools
import hashlib
import math
import re
import select
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from datetime import date
from pathlib import Path
from typing import Annotated, Literal, NamedTuple, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from scrape_assets import demo_markup
from scrape_assets.demo_site import (
    DemoRequestHandler, DemoResponse, DemoServer, LoggedRequest, etag_matches, respond, serve_forever, strong_etag,
)
from scrape_assets.errors import SpecError
from scrape_assets.yaml_models import parse_yaml_model, read_text_file

ROBOTS_PATH = "/robots.txt"
OFFSITE_BASE_URL = "http://offsite.scrape-assets.invalid/"
_LISTING_PATHS = r"^/catalogue/category/"
_PAUSE_STEP_S = 0.05


# --- the spec -----------------------------------------------------------------------------------


class _Strict(BaseModel):
    # allow_inf_nan: .inf passed ge=0 / gt=0, then every matching request died in the handler
    # (int(inf): OverflowError) and the client saw the connection drop, not the fault
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


RetryAfterForm = Literal["seconds", "http-date"]


def _check_regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"expected a regular expression: {exc}") from exc
    return value


class _Rule(_Strict):
    match: str = Field(description="regex searched in the request path (without the query)")
    first_n: int | None = Field(default=None, ge=1, description="apply to the first N requests of a path; None: always")

    _match_is_a_regex = field_validator("match")(_check_regex)

    def applies(self, path: str, attempt: int) -> bool:
        """Whether this rule acts on the ``attempt``-th request (1-based) of ``path``."""
        return re.search(self.match, path) is not None and (self.first_n is None or attempt <= self.first_n)


class HttpError(_Rule):
    """Answer an error status: 5xx (retried) or a 4xx refusal such as 404 or 403 (not retried)."""

    fault: Literal["http_error"]
    status: int = Field(default=503, ge=400, le=599)
    retry_after_s: float | None = Field(default=None, ge=0, le=10_000_000)  # ~116 days: an HTTP-date can say it
    retry_after_form: RetryAfterForm = "seconds"


class Http429(_Rule):
    fault: Literal["http_429"]
    retry_after_s: float | None = Field(default=1.0, ge=0, le=10_000_000)
    retry_after_form: RetryAfterForm = "seconds"


class ResetMidBody(_Rule):
    fault: Literal["reset_mid_body"]
    after_bytes: int | None = Field(default=None, ge=0)


class ShortBody(_Rule):
    fault: Literal["short_body"]
    send_bytes: int | None = Field(default=None, ge=0)


class Trickle(_Rule):
    fault: Literal["trickle"]
    bytes_per_s: float = Field(default=1000.0, gt=0)
    interval_s: float = Field(default=_PAUSE_STEP_S, gt=0, le=60)


class StallAfterHeaders(_Rule):
    fault: Literal["stall_after_headers"]
    max_stall_s: float = Field(default=60.0, gt=0, le=3600)


class BadGzip(_Rule):
    fault: Literal["bad_gzip"]


class OversizeBody(_Rule):
    fault: Literal["oversize_body"]
    body_bytes: int = Field(default=10_000_001, ge=1, le=1_000_000_000)
    declare_length: bool = True


class GzipBomb(_Rule):
    fault: Literal["gzip_bomb"]
    decompressed_bytes: int = Field(default=20_000_000, ge=1, le=1_000_000_000)


class RedirectLoop(_Rule):
    fault: Literal["redirect_loop"]
    status: Literal[301, 302, 303, 307, 308] = 302


class RedirectOffsite(_Rule):
    fault: Literal["redirect_offsite"]
    status: Literal[301, 302, 303, 307, 308] = 302
    location: str = Field(default=OFFSITE_BASE_URL, pattern=r"^https?://[^/]+/", description="base URL of the other host")


class CharsetMissing(_Rule):
    fault: Literal["charset_missing"]


class CharsetWrong(_Rule):
    fault: Literal["charset_wrong"]
    declared: str = Field(default="iso-8859-1", pattern=r"^[A-Za-z0-9_.:-]+$")


class LayoutChanged(_Rule):
    fault: Literal["layout_changed"]


class ZeroProducts(_Rule):
    fault: Literal["zero_products"]
    keep_counts: bool = True


class RobotsDisallow(_Rule):
    fault: Literal["robots_disallow"]
    match: str = re.escape(ROBOTS_PATH) + "$"
    prefix: str = Field(pattern=r"^/", description='path prefix to disallow, e.g. "/catalogue/category/books/mystery_3/"')


_RULE_CLASSES: tuple[type[_Rule], ...] = (
    HttpError, Http429, ResetMidBody, ShortBody, Trickle, StallAfterHeaders, BadGzip, OversizeBody, GzipBomb,
    RedirectLoop, RedirectOffsite, CharsetMissing, CharsetWrong, LayoutChanged, ZeroProducts, RobotsDisallow,
)
#: One rule of a spec; the ``fault`` key says which model validates it.
FaultRule = Annotated[Union[_RULE_CLASSES], Field(discriminator="fault")]
_RULE_MODELS: dict[str, type[_Rule]] = {cls.model_fields["fault"].annotation.__args__[0]: cls for cls in _RULE_CLASSES}
#: Every fault kind, in the order of the module docstring.
FAULT_KINDS: tuple[str, ...] = tuple(_RULE_MODELS)
#: Kinds that change the page's content, not the transport: the body is complete but different.
CONTENT_KINDS = frozenset({"charset_missing", "charset_wrong", "layout_changed", "zero_products"})
#: Kinds that serve a page other than the demo's: conditional requests are checked against it.
_CHANGED_PAGE_KINDS = CONTENT_KINDS | {"robots_disallow"}
#: faults that end the connection after the head without announcing it (for a GET, that is the fault)
_CLOSES_AFTER_HEAD = frozenset({"reset_mid_body", "short_body", "oversize_body"})
#: Kinds that break the body of a full answer: a conditional request gets the 200 they break
#: (a 304 has no body; stalling after one would hang the connection's next request instead).
_BODY_KINDS = frozenset({"reset_mid_body", "short_body", "trickle", "stall_after_headers", "bad_gzip",
                         "oversize_body", "gzip_bomb"})


class Rates(_Strict):
    """Random faults: a probability per kind, drawn per ``(seed, path, attempt)``."""

    seed: int
    match: str = _LISTING_PATHS
    http_error: float = Field(default=0.0, ge=0, le=1)
    http_429: float = Field(default=0.0, ge=0, le=1)
    reset_mid_body: float = Field(default=0.0, ge=0, le=1)
    short_body: float = Field(default=0.0, ge=0, le=1)
    trickle: float = Field(default=0.0, ge=0, le=1)
    stall_after_headers: float = Field(default=0.0, ge=0, le=1)
    bad_gzip: float = Field(default=0.0, ge=0, le=1)
    oversize_body: float = Field(default=0.0, ge=0, le=1)
    gzip_bomb: float = Field(default=0.0, ge=0, le=1)
    redirect_loop: float = Field(default=0.0, ge=0, le=1)
    redirect_offsite: float = Field(default=0.0, ge=0, le=1)
    charset_missing: float = Field(default=0.0, ge=0, le=1)
    charset_wrong: float = Field(default=0.0, ge=0, le=1)
    layout_changed: float = Field(default=0.0, ge=0, le=1)
    zero_products: float = Field(default=0.0, ge=0, le=1)

    _match_is_a_regex = field_validator("match")(_check_regex)

    @model_validator(mode="after")
    def _at_most_one(self) -> Rates:
        total = sum(self.probabilities().values())
        if total > 1 + 1e-9:
            raise ValueError(f"expected probabilities summing to at most 1, got {total:g}")
        return self

    def probabilities(self) -> dict[str, float]:
        """``{kind: probability}`` for the kinds with a non-zero rate, in a fixed order."""
        return {k: getattr(self, k) for k in FAULT_KINDS if k in type(self).model_fields and getattr(self, k) > 0}

    def draw(self, path: str, attempt: int) -> _Rule | None:
        """The fault for the ``attempt``-th request of ``path`` (with default options), or None."""
        if re.search(self.match, path) is None:
            return None
        digest = hashlib.blake2b(f"{self.seed}:{path}:{attempt}".encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "big") / 2**64
        cumulative = 0.0
        for kind, p in self.probabilities().items():
            cumulative += p
            if u < cumulative:
                return _RULE_MODELS[kind](fault=kind, match=self.match)
        return None


class FaultSpec(_Strict):
    """What the faulty server breaks: ``rules`` first, then ``rates`` (see the module docstring)."""

    rules: list[FaultRule] = Field(default_factory=list)
    rates: Rates | None = None

    def choose(self, path: str, attempt: int) -> _Rule | None:
        """The fault for the ``attempt``-th (1-based) request of ``path`` (no query), or None."""
        for rule in self.rules:
            if rule.applies(path, attempt):
                return rule
        return self.rates.draw(path, attempt) if self.rates is not None else None


def _location(loc: tuple) -> str:
    parts = [str(p) for i, p in enumerate(loc) if not (i == 2 and loc[0] == "rules" and p in _RULE_MODELS)]
    return ".".join(parts)


def parse_fault_spec(text: str, source: str) -> FaultSpec:
    """Parse and validate a fault spec (YAML, or JSON which is YAML too).

    Args:
        text: the document.
        source: file path used in error messages.

    Returns:
        The validated :class:`FaultSpec`.

    Raises:
        SpecError: malformed document, or a key missing, unknown or of the wrong value; the
            message names ``source``, the dotted key (``rules.0.status``) and what was expected.
    """
    kinds = ", ".join(FAULT_KINDS)

    def explain(error: dict, key: str | None):
        if error["type"] == "union_tag_invalid":
            return f"{key}.fault", f"unknown fault kind {error['input'].get('fault')!r}: expected one of {kinds}"
        if error["type"] == "union_tag_not_found":
            return f"{key}.fault", f"required key is missing: expected one of {kinds}"
        return None

    return parse_yaml_model(
        text,
        source,
        FaultSpec,
        expected_top="a mapping with 'rules' and/or 'rates'",
        unknown_key_hint="see the fault kinds and options in scrape_assets/faults.py",
        empty_is_mapping=True,
        location=_location,
        explain=explain,
    )


def load_fault_spec(path: str | Path) -> FaultSpec:
    """Read a fault spec file (``.yaml``, ``.yml`` or ``.json``).

    Raises:
        SpecError: the file cannot be read, or its content is invalid (see :func:`parse_fault_spec`).
    """
    return parse_fault_spec(read_text_file(Path(path), "fault spec"), str(path))


# --- page content faults (pure functions of the page bytes) -------------------------------------

_META_CHARSET = re.compile(rb"\s*<meta charset=\"[^\"]*\">", re.IGNORECASE)
_CARD = re.compile(rb"<li class=\"col-xs-6[^\"]*\">\s*<article class=\"product_pod\">.*?</article>\s*</li>", re.S)
_COUNT = re.compile(rb"<strong>\d+</strong> results(?: - showing <strong>\d+</strong> to <strong>\d+</strong>)?\.")
_PAGER = re.compile(rb"<ul class=\"pager\">.*?</ul>", re.S)


def strip_charset(body: bytes) -> bytes:
    """The page without its ``<meta charset>`` (for ``charset_missing``)."""
    return _META_CHARSET.sub(b"", body, count=1)


def change_layout(body: bytes) -> bytes:
    """The page with the price element's class renamed, as a site redesign would (``layout_changed``)."""
    return body.replace(b'<p class="price_color">', b'<p class="price price--current">')


def remove_products(body: bytes, *, keep_counts: bool = True) -> bytes:
    """The page without product cards (``zero_products``); with ``keep_counts=False`` also
    "0 results" and no pager, as an honestly empty category shows."""
    body = _CARD.sub(b"", body)
    if not keep_counts:
        body = _PAGER.sub(b"", _COUNT.sub(b"<strong>0</strong> results.", body))
    return body


def robots_with_disallow(body: bytes, prefix: str) -> bytes:
    """robots.txt with ``Disallow: prefix`` added to its last group (the demo's ``User-agent: *``)."""
    return body.rstrip(b"\n") + f"\nDisallow: {prefix}\n".encode()


def content_body(rule: _Rule | None, body: bytes) -> bytes:
    """The body the faulty server sends in full for ``rule`` (content faults change it; others do not)."""
    if isinstance(rule, CharsetMissing):
        return strip_charset(body)
    if isinstance(rule, LayoutChanged):
        return change_layout(body)
    if isinstance(rule, ZeroProducts):
        return remove_products(body, keep_counts=rule.keep_counts)
    if isinstance(rule, RobotsDisallow):
        return robots_with_disallow(body, rule.prefix)
    return body


@functools.lru_cache(maxsize=4)
def gzip_bomb_bytes(decompressed_bytes: int) -> bytes:
    """A gzip stream (RFC 1952) of ``decompressed_bytes`` of HTML whitespace: ~1 KB per MB."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = b"<!DOCTYPE html>"[:decompressed_bytes]
    parts = [packer.compress(head)]
    left, block = decompressed_bytes - len(head), b" " * (1 << 20)
    while left > 0:
        parts.append(packer.compress(block[: min(left, len(block))]))
        left -= len(block)
    parts.append(packer.flush())
    return b"".join(parts)


# --- the server --------------------------------------------------------------------------------


class FaultEvent(NamedTuple):
    """One request answered by :class:`FaultyDemoServer`.

    Attributes:
        at_s: ``time.monotonic()`` when the request arrived (as in ``DemoServer.requests``).
        method: HTTP method.
        path: request path without the query.
        attempt: 1-based count of requests for ``path`` on this server.
        fault: the fault kind applied, or None when served normally.
        status: status code sent.
        retry_after: the ``Retry-After`` header sent, or None.
        retry_after_s: seconds that header asked to wait, counted from ``answered_s``.
        answered_s: ``time.monotonic()`` just before the status line and headers were written
            (logged first, so the log is complete by the time the client has its answer).
    """

    at_s: float
    method: str
    path: str
    attempt: int
    fault: str | None
    status: int
    retry_after: str | None
    retry_after_s: float | None
    answered_s: float


class RetryAfterWait(NamedTuple):
    """How long a client waited after a ``Retry-After``: next request of the path minus the answer."""

    path: str
    attempt: int
    asked_s: float
    waited_s: float


class FaultyDemoServer(DemoServer):
    """A :class:`DemoServer` that applies a :class:`FaultSpec` (see the module docstring).

    Attributes:
        spec: the faults to apply.
        stopping: set by :meth:`shutdown` / :meth:`server_close`; ends stalls and trickles.
        on_request: optional ``callback(path, attempt)`` run in the handler thread before the
            answer (tests use it to change the world at an exact moment, e.g. break storage).
    """

    def __init__(self, address: tuple[str, int], spec: FaultSpec, *, day: date | None = None):
        self.spec = spec
        self.stopping = threading.Event()
        self.on_request: Callable[[str, int], None] | None = None
        self._attempts: dict[str, int] = {}
        self._faults: list[FaultEvent] = []
        super().__init__(address, FaultyDemoRequestHandler, day=day)

    def begin(self, method: str, target: str, headers: Mapping[str, str]) -> tuple[float, str, int]:
        """Log the request; return ``(arrival time, path without query, attempt number)``."""
        path = target.split("#", 1)[0].split("?", 1)[0]
        selected = {name: headers[name] for name in self.logged_headers if headers.get(name) is not None}
        with self._lock:  # one lock for both logs: attempt numbers follow arrival order
            at_s = time.monotonic()
            self._requests.append(LoggedRequest(at_s, method, target, selected))
            attempt = self._attempts[path] = self._attempts.get(path, 0) + 1
        return at_s, path, attempt

    def log_fault(self, event: FaultEvent) -> None:
        with self._lock:
            self._faults.append(event)

    @property
    def fault_log(self) -> list[FaultEvent]:
        """A snapshot (copy) of the answers sent, oldest first."""
        with self._lock:
            return list(self._faults)

    def attempts(self, path: str) -> int:
        """Requests received for ``path`` (query ignored)."""
        with self._lock:
            return self._attempts.get(path, 0)

    @property
    def attempt_counts(self) -> dict[str, int]:
        """A snapshot (copy) of the requests received per path (query ignored)."""
        with self._lock:
            return dict(self._attempts)

    def shutdown(self) -> None:
        self.stopping.set()
        super().shutdown()

    def server_close(self) -> None:
        self.stopping.set()
        super().server_close()


class _NoBody:
    """Where a HEAD answer's body goes: nowhere."""

    def write(self, data: bytes) -> int:
        return len(data)

    def flush(self) -> None:
        pass


class FaultyDemoRequestHandler(DemoRequestHandler):
    """Serves the demo catalogue, breaking the responses its server's :class:`FaultSpec` names."""

    server: FaultyDemoServer

    def handle_demo(self) -> None:
        if not self.drain_request_body():
            return
        at_s, path, attempt = self.server.begin(self.command, self.path, self.headers)
        if self.server.on_request is not None:
            self.server.on_request(path, attempt)
        rule = self.server.spec.choose(path, attempt)
        self._event = dict(at_s=at_s, method=self.command, path=path, attempt=attempt,
                           fault=rule.fault if rule is not None else None)
        # HEAD is answered as GET with the body left out (_send_head): its Content-Length and a
        # changed page's ETag are the GET's (RFC 9110 §9.3.2), whatever the fault writes.
        method = "GET" if self.command == "HEAD" else self.command
        if rule is not None and rule.fault in _CHANGED_PAGE_KINDS | _BODY_KINDS:
            # The page changed: the client's validators are checked against the changed page
            # (_send_content), not the original, or a conditional GET would never see the change.
            # A body fault breaks the full page, whatever validators the client sent.
            conditional = ("if-none-match", "if-modified-since")
            response = respond(method, self.path, {k: v for k, v in self.headers.items()
                                                   if k.lower() not in conditional}, day=self.server.day)
        else:
            response = respond(method, self.path, self.headers, day=self.server.day)
        self._sent_status: int | None = None
        connection = self.wfile
        try:
            if rule is None:
                self._send(response.status, response.headers, response.body)
            else:
                getattr(self, f"_fault_{rule.fault}")(rule, response)
        finally:
            self.wfile = connection  # after a HEAD's head: the next request on the connection is answered
            self.server.log_access(self.command, self.path, self._sent_status, self.headers,
                                   f" [attempt {attempt}" + (f", fault {rule.fault}]" if rule is not None else "]"))

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = handle_demo

    # -- writing ------------------------------------------------------------------------------
    def _send_head(self, status: int, headers: Mapping[str, str], *, retry_after_s: float | None = None) -> None:
        self._sent_status = status
        if self.command == "HEAD" and self._event["fault"] in _CLOSES_AFTER_HEAD:
            # the fault ends the connection after the head (a HEAD's body goes nowhere): say so, or
            # a keep-alive client sends its next request on a connection about to die
            headers = {**headers, "Connection": "close"}
            self.close_connection = True
        self.send_response(status)  # buffered until end_headers()
        for name, value in headers.items():
            self.send_header(name, value)
        # Logged before the client can see the answer, so the log is complete when the client is done.
        self.server.log_fault(FaultEvent(
            **self._event, status=status, retry_after=headers.get("Retry-After"), retry_after_s=retry_after_s,
            answered_s=time.monotonic(),
        ))
        self.end_headers()
        if self.command == "HEAD":
            self.wfile = _NoBody()  # whatever body the fault writes (handle_demo restores the connection)

    def _send(self, status: int, headers: Mapping[str, str], body: bytes, **head) -> None:
        headers = {**headers, "Content-Length": str(len(body))}
        self._send_head(status, headers, **head)
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _pause(self, seconds: float) -> bool:
        """Wait up to ``seconds``; False as soon as the server stops or the client hangs up."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            if self.server.stopping.wait(min(remaining, _PAUSE_STEP_S)):
                return False
            try:
                readable, _, _ = select.select([self.connection], [], [], 0)
                if readable and not self.connection.recv(1, socket.MSG_PEEK):
                    return False  # orderly close by the client
            except OSError:
                return False
        return True

    def _full_headers(self, response: DemoResponse, body: bytes) -> dict[str, str]:
        headers = dict(response.headers)
        if body != response.body and "ETag" in headers:
            headers["ETag"] = strong_etag(body)
        return headers

    # -- status faults ------------------------------------------------------------------------
    def _error(self, status: int, reason: str, retry_after_s: float | None, form: RetryAfterForm) -> None:
        body = demo_markup.error_page(f"{status} {reason}", "fault injected by scrape_assets.faults").encode()
        headers = {"Content-Type": "text/html; charset=utf-8"}
        asked = None
        if retry_after_s is not None:
            if form == "seconds":
                headers["Retry-After"] = str(int(retry_after_s)) if retry_after_s == int(retry_after_s) else f"{retry_after_s:g}"
                asked = retry_after_s
            else:  # RFC 9110 HTTP-date, rounded up so the date is never earlier than asked
                now = time.time()
                when = math.ceil(now + retry_after_s)
                headers["Retry-After"] = email.utils.formatdate(when, usegmt=True)
                asked = when - now
        self._send(status, headers, body, retry_after_s=asked)

    def _fault_http_error(self, rule: HttpError, response: DemoResponse) -> None:
        reasons = {500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}
        self._error(rule.status, reasons.get(rule.status, "Server Error"), rule.retry_after_s, rule.retry_after_form)

    def _fault_http_429(self, rule: Http429, response: DemoResponse) -> None:
        self._error(429, "Too Many Requests", rule.retry_after_s, rule.retry_after_form)

    # -- transport faults ---------------------------------------------------------------------
    def _fault_reset_mid_body(self, rule: ResetMidBody, response: DemoResponse) -> None:
        body = response.body
        self._send_head(response.status, response.headers)
        self.wfile.write(body[: len(body) // 2 if rule.after_bytes is None else rule.after_bytes])
        self._pause(_PAUSE_STEP_S)  # let the bytes reach the client before the reset
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()  # with SO_LINGER 0: RST, not FIN
        self.close_connection = True

    def _fault_short_body(self, rule: ShortBody, response: DemoResponse) -> None:
        body = response.body
        self._send_head(response.status, response.headers)
        self.wfile.write(body[: len(body) // 2 if rule.send_bytes is None else rule.send_bytes])
        self.close_connection = True  # FIN after fewer bytes than Content-Length

    def _fault_trickle(self, rule: Trickle, response: DemoResponse) -> None:
        # The connection closes after the (complete) body, so the head says so, as a server
        # that closes must (RFC 9112 section 9.6): a client would otherwise send its next
        # request on it and meet the close, an attempt the fault never meant.
        self._send_head(response.status, {**response.headers, "Connection": "close"})
        step = max(1, round(rule.bytes_per_s * rule.interval_s))
        for offset in range(0, len(response.body), step):
            self.wfile.write(response.body[offset : offset + step])
            if not self._pause(rule.interval_s):
                break
        self.close_connection = True

    def _fault_stall_after_headers(self, rule: StallAfterHeaders, response: DemoResponse) -> None:
        self._send_head(response.status, {**response.headers, "Connection": "close"})  # closes after: see trickle
        self._pause(rule.max_stall_s)
        self.close_connection = True

    # -- body faults --------------------------------------------------------------------------
    def _fault_bad_gzip(self, rule: BadGzip, response: DemoResponse) -> None:
        self._send(response.status, {**response.headers, "Content-Encoding": "gzip"}, response.body)

    def _fault_oversize_body(self, rule: OversizeBody, response: DemoResponse) -> None:
        headers = {k: v for k, v in response.headers.items() if k not in ("Content-Length", "ETag")}
        if rule.declare_length:
            headers["Content-Length"] = str(rule.body_bytes)
        else:
            headers["Connection"] = "close"  # the body ends when the connection does
        self._send_head(response.status, headers)
        head = response.body[: rule.body_bytes]
        self.wfile.write(head)
        left, block = rule.body_bytes - len(head), b" " * 65536
        while left > 0 and not self.server.stopping.is_set():
            self.wfile.write(block[: min(left, len(block))])
            left -= len(block)
        self.close_connection = True

    def _fault_gzip_bomb(self, rule: GzipBomb, response: DemoResponse) -> None:
        headers = {k: v for k, v in response.headers.items() if k != "ETag"}
        self._send(response.status, {**headers, "Content-Encoding": "gzip"}, gzip_bomb_bytes(rule.decompressed_bytes))

    # -- redirects ----------------------------------------------------------------------------
    def _fault_redirect_loop(self, rule: RedirectLoop, response: DemoResponse) -> None:
        path = self._event["path"]
        location = path if "?" in self.path else f"{path}?loop=1"
        self._send(rule.status, {"Location": location}, b"")

    def _fault_redirect_offsite(self, rule: RedirectOffsite, response: DemoResponse) -> None:
        self._send(rule.status, {"Location": rule.location + self.path.lstrip("/")}, b"")

    # -- content faults -----------------------------------------------------------------------
    def _send_content(self, status: int, headers: dict[str, str], body: bytes) -> None:
        """The changed page, or 304 when the client's ``If-None-Match`` names its ETag.

        ``If-Modified-Since`` alone never gets a 304 here: the page changed after its
        ``Last-Modified`` (the demo's date stays) as far as the client can know.
        """
        tags = self.headers.get("If-None-Match")
        if status == 200 and tags and "ETag" in headers and etag_matches(tags, headers["ETag"]):
            self._send_head(304, {k: headers[k] for k in ("ETag", "Last-Modified") if k in headers})
            return
        self._send(status, headers, body)

    def _fault_charset_missing(self, rule: CharsetMissing, response: DemoResponse) -> None:
        body = content_body(rule, response.body)
        headers = self._full_headers(response, body)
        headers["Content-Type"] = headers.get("Content-Type", "text/html").split(";", 1)[0]
        self._send_content(response.status, headers, body)

    def _fault_charset_wrong(self, rule: CharsetWrong, response: DemoResponse) -> None:
        media_type = response.headers.get("Content-Type", "text/html").split(";", 1)[0]
        headers = {**response.headers, "Content-Type": f"{media_type}; charset={rule.declared}"}
        if "ETag" in headers:  # same bytes, another representation (RFC 9110 §8.8.3): another entity tag
            tagged = headers["Content-Type"].encode() + b"\n" + response.body
            headers["ETag"] = strong_etag(tagged)
        self._send_content(response.status, headers, response.body)

    def _content(self, rule: _Rule, response: DemoResponse) -> None:
        body = content_body(rule, response.body)
        self._send_content(response.status, self._full_headers(response, body), body)

    _fault_layout_changed = _fault_zero_products = _fault_robots_disallow = _content


def make_fault_server(spec: FaultSpec, host: str = "127.0.0.1", port: int = 0, *, day: date | None = None) -> FaultyDemoServer:
    """Bind a :class:`FaultyDemoServer` on ``host:port`` (0 picks a free port); call ``serve_forever()``.

    Args:
        spec: the faults to apply.
        host: address to bind.
        port: port to bind; 0 for any free one (see ``server.base_url``).
        day: fixed catalogue day; None resolves per request (see ``demo_site.resolve_day``).

    Raises:
        OSError: the address cannot be bound.
    """
    return FaultyDemoServer((host, port), spec, day=day)


def serve_faulty_forever(spec_path: str | Path, host: str, port: int) -> None:
    """Serve the demo catalogue with the faults of ``spec_path`` until Ctrl-C.

    Raises:
        SpecError: the fault spec is unreadable or invalid.
        OSError: the address cannot be bound.
    """
    spec = load_fault_spec(spec_path)
    rates = f", rates with seed {spec.rates.seed}" if spec.rates else ""
    note = f" with faults from {spec_path}: {len(spec.rules)} rule(s){rates}"
    serve_forever(host, port, server=make_fault_server(spec, host, port), note=note)


def retry_after_waits(server: FaultyDemoServer) -> list[RetryAfterWait]:
    """Every answer that carried ``Retry-After`` and was followed by another request of its path:
    how long the server asked for, and how long passed until that next request arrived."""
    log = server.fault_log
    waits = []
    for i, event in enumerate(log):
        if event.retry_after_s is None:
            continue
        following = next((e for e in log[i + 1 :] if e.path == event.path), None)
        if following is not None:
            waits.append(RetryAfterWait(event.path, event.attempt, event.retry_after_s, following.at_s - event.answered_s))
    return waits
