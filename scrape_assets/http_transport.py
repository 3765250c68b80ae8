"""An httpx transport that sends requests with aiohttp: httpx's API, aiohttp's cheaper connections.

Why: on this project's workload (many small GETs to one host, tens of connections) httpx's
own transport (httpcore) costs about 1 ms of CPU per request at 16 connections and about
5 ms at 64 (its pool checks every connection on each request), which bounded the whole
crawl (BENCHMARKS.md). aiohttp's connector does the same work in about 0.2 ms, flat from 16
to 64 connections. The robots.txt cache and the tests keep speaking httpx
(``httpx.MockTransport`` in unit tests, ``mounts`` for the in-process demo site); only the
bytes on the wire go through aiohttp. Pages go one step further: :meth:`AiohttpTransport.get`
takes the headers httpx's client would send and skips its client, request and response
objects (about half of what a request through ``httpx.AsyncClient`` costs here, 0.3 of
0.65 ms), with httpx's header semantics; bodies come as sent (the fetcher decodes them:
:mod:`scrape_assets.content_coding`).

Why not the ``httpx-aiohttp`` package: its exception map turns a refused connection or a
server that hangs up into ``httpx.ConnectTimeout``, which would make a dead host look like a
slow one in dead letters, and lets aiohttp's response errors escape unmapped. Here each
aiohttp error becomes the httpx error httpcore raises for the same condition, so
:func:`scrape_assets.retry.classify_exception` keeps one table:

    aiohttp                                  httpx
    ConnectionTimeoutError                   ConnectTimeout
    SocketTimeoutError, ServerTimeoutError,  ReadTimeout
    asyncio.TimeoutError
    ClientConnectorError (refused, DNS, TLS) ConnectError
    ServerDisconnectedError                  RemoteProtocolError  (hung up before/while answering)
    ClientPayloadError                       RemoteProtocolError  (body shorter than Content-Length,
                                                                   bad chunking)
    ClientHttpProxyError                     ProxyError           (the proxy refused a CONNECT tunnel;
                                                                   the message names its status)
    ClientResponseError                      RemoteProtocolError  (malformed status line/headers)
    ClientOSError                            ReadError            (reset by peer)
    InvalidURL, NonHttpUrlClientError        UnsupportedProtocol
    any other aiohttp.ClientError            TransportError

The httpx error's text is aiohttp's, on one line; for an answer aiohttp's parser refuses,
without the parser's own "400" (no status the server sent) and the page's URL (see
:func:`_message`).

Every request is sent once: aiohttp's silent resend after a hang-up is turned off, so each
attempt the fetcher counts (and spaces out politely) is one request on the wire.

Proxies: only the one passed as ``proxy`` (``SCRAPE_PROXY_URL``, see
:mod:`scrape_assets.proxies`), an ``http://`` forward proxy: ``http`` URLs go to it in
absolute form, ``https`` ones through a ``CONNECT`` tunnel (with the request's
``User-Agent``). aiohttp is given the proxy's address only; its credentials go out as a
``Proxy-Authorization`` header (on each ``http`` request, on the ``CONNECT`` for ``https``),
so aiohttp's error messages cannot contain them, and with credentials set an aiohttp error
is not chained to the httpx one (its ``request_info`` holds that header). ``trust_env`` is
off: ``HTTP(S)_PROXY`` / ``NO_PROXY`` variables are ignored, so a proxy meant for package
installs never carries a crawl by surprise.

Limits: HTTP/1.1 only (no HTTP/2); no proxy chains or SOCKS proxies;
bodies are passed through undecoded (pages and robots.txt undo ``Content-Encoding`` with
:func:`scrape_assets.content_coding.decode_body`); no cookie jar
(aiohttp's is disabled; :func:`scrape_assets.fetcher.build_client` gives httpx one that
refuses every cookie). Response headers larger than aiohttp's parser limits
(8,190 bytes a line) are a ``RemoteProtocolError``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable, Mapping

import aiohttp
import httpx
from aiohttp.http_exceptions import HttpProcessingError
from yarl import URL

from scrape_assets.errors import without_addresses
from scrape_assets.proxies import ProxyURL

_EXCEPTIONS: tuple[tuple[type[BaseException], type[httpx.TransportError]], ...] = (
    # First match wins: subclasses before their bases.
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
    (aiohttp.ServerTimeoutError, httpx.ReadTimeout),  # includes SocketTimeoutError
    (asyncio.TimeoutError, httpx.ReadTimeout),
    (aiohttp.ClientConnectorError, httpx.ConnectError),
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),
    (aiohttp.ClientPayloadError, httpx.RemoteProtocolError),
    (aiohttp.ClientHttpProxyError, httpx.ProxyError),
    (aiohttp.ClientResponseError, httpx.RemoteProtocolError),
    (aiohttp.InvalidURL, httpx.UnsupportedProtocol),
    (aiohttp.NonHttpUrlClientError, httpx.UnsupportedProtocol),
    (aiohttp.ClientOSError, httpx.ReadError),
    (aiohttp.ClientError, httpx.TransportError),
)


def _mapped(exc: BaseException, request: httpx.Request) -> httpx.TransportError:
    """The httpx error for the same condition as aiohttp's ``exc`` (module table), with
    :func:`_message`'s text."""
    for source, target in _EXCEPTIONS:
        if isinstance(exc, source):
            return target(_message(exc, request.url.scheme), request=request)
    raise TypeError(f"not an aiohttp error: {type(exc).__name__}")  # pragma: no cover - table ends with ClientError


def _message(exc: BaseException, scheme: str = "https") -> str:
    """aiohttp's text for ``exc`` on one line, as a dead letter's reason shows it.

    A connection error to an ``http`` URL loses aiohttp's `` ssl:default`` (its TLS setting,
    unused there: "Cannot connect to host shop.example:80 [Connect call failed ...]").

    A response aiohttp's parser refuses (a malformed status line, header or chunk; a body
    shorter than its ``Content-Length``) reads ``400, message="...", url='...'`` in aiohttp:
    the 400 is the parser's own code, not a status the server sent (the page's
    ``http_status`` is what the server sent, if anything), and the URL is the page's, which
    the dead letter names already. Kept: the parser's message, its caret line dropped, as
    ``malformed response: Invalid header token: b'Content-Length 1000'`` or ``Response
    payload is not completed: Not enough data to satisfy content length header (received 10
    of 1000 bytes).`` A server that hangs up inside the headers reads ``Server disconnected
    before the response's headers were complete``, not aiohttp's dump of the headers it had
    (cookies included). A proxy's refusal keeps aiohttp's text: its status is the proxy's.
    """
    if isinstance(exc, aiohttp.ServerDisconnectedError) and not isinstance(exc.message, str):
        # aiohttp's C parser hands over the headers read so far (Set-Cookie included): not for a dead letter
        return "Server disconnected before the response's headers were complete"
    cause = exc.__cause__
    if isinstance(cause, HttpProcessingError) and not isinstance(exc, aiohttp.ClientHttpProxyError):
        if isinstance(exc, aiohttp.ClientPayloadError):
            return f"Response payload is not completed: {_one_line(cause.message)}"
        if isinstance(exc, aiohttp.ClientResponseError):
            return f"malformed response: {_one_line(exc.message)}"
    # "ssl:<ssl.SSLContext object at 0x7f...>" in a connection error: no address, so the same
    # failure reads the same in every run (dead letters group by reason)
    text = without_addresses(str(exc)) or type(exc).__name__
    return text.replace(" ssl:default [", " [", 1) if scheme == "http" else text


def _one_line(message: str) -> str:
    """aiohttp's multi-line parser message on one line, without the line of its ``^`` pointer."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip(" ^"))


_AIOHTTP_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


def _wire_headers(headers: httpx.Headers) -> list[tuple[str, str]]:
    """httpx's request headers as aiohttp takes them: ``(name, value)`` strings, bytes kept (latin-1)."""
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers.raw]


async def _body_chunks(response: aiohttp.ClientResponse, request: Callable[[], httpx.Request],
                       chain: bool) -> AsyncIterator[bytes]:
    """``response``'s body bytes as they arrive (undecoded), aiohttp's errors mapped (module table)."""
    chunks = response.content.iter_any().__aiter__()
    while True:
        failure = None
        try:
            chunk = await chunks.__anext__()
        except StopAsyncIteration:
            return
        except _AIOHTTP_ERRORS as exc:
            failure = exc
        if failure is not None:  # raised outside the except: no __context__ (see AiohttpTransport._send)
            raise _mapped(failure, request()) from (failure if chain else None)
        yield chunk


class _ResponseStream(httpx.AsyncByteStream):
    """The body of one aiohttp response, chunk by chunk as it arrives."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request, *, chain: bool) -> None:
        self._response = response
        self._request = request
        self._chain = chain

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _body_chunks(self._response, lambda: self._request, self._chain)

    async def aclose(self) -> None:
        # release() returns a fully read connection to the pool and closes one whose body
        # was not read to the end (an error page we skipped, a deadline that cut it short).
        self._response.release()


class DirectResponse:
    """A response of :meth:`AiohttpTransport.get`: status, headers as httpx would give them, the body as sent.

    ``headers`` is an :class:`httpx.Headers` of the raw response headers (httpx's decoding
    and its merging of repeated names). The body is aiohttp's bytes as they arrive, still in
    their ``Content-Encoding`` (the fetcher decodes it with
    :func:`scrape_assets.content_coding.decode_body`). Errors while reading are mapped as in
    the module table.
    """

    __slots__ = ("status", "headers", "_response", "_request", "_chain")

    def __init__(self, response: aiohttp.ClientResponse, request: Callable[[], httpx.Request], *, chain: bool) -> None:
        self.status = response.status
        self.headers = httpx.Headers(response.raw_headers)
        self._response = response
        self._request = request
        self._chain = chain

    def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body as sent (still encoded), chunk by chunk as it arrives."""
        return _body_chunks(self._response, self._request, self._chain)

    def release(self) -> None:
        """Return a fully read connection to the pool; close one whose body was not read to the end."""
        self._response.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """Send httpx requests through one :class:`aiohttp.ClientSession` (see the module docstring).

    The session and its connection pool are created on the first request, inside the running
    event loop, and closed by :meth:`aclose` (``httpx.AsyncClient.aclose`` calls it). Use one
    transport per event loop.

    Args:
        max_connections: most open connections in all (aiohttp ``TCPConnector(limit=...)``).
        keepalive_expiry_s: seconds an idle keep-alive connection is kept (default 15, as
            aiohttp's).
        verify: ``True`` to verify TLS certificates with certifi's CAs, as httpx does (the
            context is built on the first https request), ``False`` not to, or an
            :class:`ssl.SSLContext`.
        proxy: ``http://[user:pass@]host:port`` of a forward proxy every request goes
            through (None: direct).

    Raises:
        ValueError: ``max_connections < 1``, or ``proxy`` is not such a URL (the message
            does not show it).
    """

    def __init__(
        self,
        *,
        max_connections: int,
        keepalive_expiry_s: float = 15.0,
        verify: bool | ssl.SSLContext = True,
        proxy: str | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        try:
            self._proxy = ProxyURL.parse(proxy) if proxy is not None else None
        except ValueError as exc:
            raise ValueError(f"proxy: {exc}") from None
        self._chain = self._proxy is None or self._proxy.authorization is None
        self._max_connections = max_connections
        self._keepalive_expiry_s = keepalive_expiry_s
        self._verify = verify
        self._certifi_context: ssl.SSLContext | None = None
        self._session: aiohttp.ClientSession | None = None

    def _session_for_request(self) -> aiohttp.ClientSession:
        if self._session is None:
            # verify=True: certifi's CAs, as httpx's own transport, given per https request
            # (_tls_for): building that context costs ~50 ms, which a plain-http crawl skips.
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, keepalive_timeout=self._keepalive_expiry_s, ssl=self._verify
            )
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False
            )
            # aiohttp resends a GET once, at once, when the server hangs up or resets before
            # answering: a request the fetcher would neither count nor space out (politeness,
            # backoff). Off, as aiohttp's own test_utils does; the fetcher's retries decide.
            # (A private attribute: aiohttp is pinned, and a test counts the requests.)
            self._session._retry_connection = False
        return self._session

    def _tls_for(self, url: httpx.URL) -> dict:
        """``ssl=`` of an https request when verifying with certifi's CAs (built on first use)."""
        if self._verify is not True or url.scheme != "https":
            return {}
        if self._certifi_context is None:
            self._certifi_context = httpx.create_ssl_context()
        return {"ssl": self._certifi_context}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; return once the status line and headers have arrived.

        Raises:
            httpx.TransportError: a subclass per the module table.
        """
        body = await request.aread()
        response = await self._send(request.method, request.url, _wire_headers(request.headers), body,
                                    request.extensions.get("timeout", {}), lambda: request)
        extensions = {"http_version": b"HTTP/1.1", "reason_phrase": (response.reason or "").encode("latin-1", "replace")}
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_ResponseStream(response, request, chain=self._chain),
            request=request,
            extensions=extensions,
        )

    async def get(self, url: httpx.URL, headers: httpx.Headers, timeout: Mapping[str, float | None]) -> DirectResponse:
        """Send a GET without httpx's client, request and response objects; return at its headers.

        What :class:`~scrape_assets.fetcher.PageFetcher` sends each page through: about half
        the CPU of a request through ``httpx.AsyncClient`` on this transport (0.3 against
        0.65 ms at 16 connections, ``benchmarks/micro.py``). The caller gives the complete
        request headers (the client's defaults merged with its own, as httpx would send
        them) and ``timeout`` as ``httpx.Timeout.as_dict()``; the response's headers are those
        httpx would give, its body the bytes as sent (see :class:`DirectResponse`). Release the
        response when done with it.

        Raises:
            httpx.TransportError: a subclass per the module table.
        """
        # Host first, from the URL as httpx writes it (aiohttp would drop a trailing dot).
        raw = [("Host", url.netloc.decode("ascii"))]
        raw += [header for header in _wire_headers(headers) if header[0].lower() != "host"]

        def request() -> httpx.Request:  # only for an error's ``request`` (built on failure)
            return httpx.Request("GET", url, headers=headers)

        response = await self._send("GET", url, raw, b"", timeout, request)
        return DirectResponse(response, request, chain=self._chain)

    async def _send(
        self, method: str, url: httpx.URL, headers: list[tuple[str, str]], body: bytes,
        timeout: Mapping[str, float | None], request: Callable[[], httpx.Request],
    ) -> aiohttp.ClientResponse:
        session = self._session_for_request()
        via: dict = {}
        if self._proxy is not None:
            via["proxy"] = self._proxy.address
            auth = self._proxy.authorization
            if url.scheme == "https":  # CONNECT: the tunnel request carries them
                agent = next((value for name, value in headers if name.lower() == "user-agent"), "")
                via["proxy_headers"] = {"User-Agent": agent, **({"Proxy-Authorization": auth} if auth else {})}
            elif auth:  # absolute-form request to the proxy, which consumes the header
                headers = [h for h in headers if h[0].lower() != "proxy-authorization"] + [("Proxy-Authorization", auth)]
        failure = None
        try:
            return await session.request(
                method,
                URL(str(url), encoded=True),  # sent exactly as httpx built it, no re-quoting
                headers=headers,
                data=body or None,
                **via,
                **self._tls_for(url),
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=timeout.get("pool"),
                    sock_connect=timeout.get("connect"),
                    sock_read=timeout.get("read"),
                ),
            )
        except _AIOHTTP_ERRORS as exc:
            failure = exc
        # Raised here, after the except block, so the httpx error has no __context__ either:
        # with proxy credentials, aiohttp's error (its request_info) holds Proxy-Authorization.
        raise _mapped(failure, request()) from (failure if self._chain else None)

    async def aclose(self) -> None:
        """Close the session and its connections (no-op if no request was sent)."""
        if self._session is not None:
            await self._session.close()
            self._session = None
