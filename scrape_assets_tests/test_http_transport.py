"""AiohttpTransport against a raw HTTP/1.1 server on 127.0.0.1: what is sent, what comes back, which error."""

from __future__ import annotations

import asyncio
import gzip
import os
import socket
import ssl

import httpx
import pytest

from scrape_assets.content_coding import decode_body
from scrape_assets.http_transport import AiohttpTransport
from scrape_assets.retry import classify_exception

pytestmark = pytest.mark.timeout(30)


class HeadServer:
    """Reads request heads (kept in ``heads``), answers each with ``reply(n)`` bytes (None: hang up).

    ``reply(n)`` may also return ``(bytes, "close")``: write them, then hang up.
    """

    def __init__(self, reply):
        self.reply = reply
        self.heads: list[bytes] = []
        self.connections = 0

    async def __aenter__(self) -> HeadServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.base = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc_info) -> None:
        self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                self.heads.append(await reader.readuntil(b"\r\n\r\n"))
                data = self.reply(len(self.heads))
                if data is None:
                    break
                close = isinstance(data, tuple)
                writer.write(data[0] if close else data)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


def _ok(body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in (f"Content-Length: {len(body)}", *headers))
    return b"HTTP/1.1 200 OK\r\n" + head.encode() + b"\r\n" + body


def _run(reply, requests):
    """Send ``requests(client, base)`` through a fresh transport; return (result, server)."""

    async def main():
        async with HeadServer(reply) as server:
            async with httpx.AsyncClient(transport=AiohttpTransport(max_connections=2), timeout=2.0) as client:
                try:
                    result = await requests(client, server.base)
                except httpx.HTTPError as exc:
                    result = exc
            return result, server

    return asyncio.run(main())


def test_requests_go_out_verbatim_and_reuse_one_connection():
    async def three(client, base):
        return [
            await client.get(base + "/a%2Fb/caf%C3%A9?q=%20x&r=1", headers={"If-None-Match": '"v1"', "User-Agent": "ua/1"}),
            await client.get(base + "/two"),
            await client.get(base + "/three"),
        ]

    responses, server = _run(lambda n: _ok(f"page {n}".encode(), 'ETag: "v2"', "X-Twice: 1", "X-Twice: 2"), three)
    assert [r.text for r in responses] == ["page 1", "page 2", "page 3"]
    assert responses[0].headers["etag"] == '"v2"'
    assert responses[0].headers.get_list("x-twice") == ["1", "2"]
    first = server.heads[0].decode().split("\r\n")
    assert first[0] == "GET /a%2Fb/caf%C3%A9?q=%20x&r=1 HTTP/1.1"  # not re-quoted
    assert 'If-None-Match: "v1"' in first and "User-Agent: ua/1" in first
    assert server.connections == 1  # keep-alive


def test_gzip_body_is_decoded_by_httpx():
    body = gzip.compress(b"<html>caf\xc3\xa9</html>")
    responses, _ = _run(lambda n: _ok(body, "Content-Encoding: gzip", "Content-Type: text/html; charset=utf-8"),
                        lambda client, base: client.get(base + "/"))
    assert responses.text == "<html>caf\u00e9</html>"



class _Direct:
    """What ``AiohttpTransport.get`` returned: status, headers and the body read to the end."""

    def __init__(self, status: int, headers: httpx.Headers, body: bytes):
        self.status, self.headers, self.body = status, headers, body


async def _direct_get(client: httpx.AsyncClient, url: str, **headers: str) -> _Direct:
    """GET ``url`` past the client, as ``PageFetcher`` sends pages: its headers merged with ``headers``."""
    merged = client.headers.copy()
    merged.update(headers)
    response = await client._transport.get(httpx.URL(url), merged, client.timeout.as_dict())
    try:
        raw = b"".join([c async for c in response.aiter_raw()])
        return _Direct(response.status, response.headers,
                       decode_body(raw, response.headers.get("content-encoding", ""), 100_000_000))
    finally:
        response.release()


def test_direct_get_sends_what_the_client_sends_and_reads_what_it_reads():
    async def both(client, base):
        path = "/a%2Fb/caf%C3%A9?q=%20x&r=1"
        via_client = await client.get(base + path, headers={"If-None-Match": '"v1"'})
        direct = await _direct_get(client, base + path, **{"If-None-Match": '"v1"'})
        return via_client, direct

    (via_client, direct), server = _run(
        lambda n: _ok(b"page", 'ETag: "v2"', "X-Twice: 1", "X-Twice: 2", "Content-Type: text/html; charset=utf-8"), both)
    assert server.heads[0] == server.heads[1]  # byte for byte: request line, header names, values and order
    assert server.heads[1].decode().startswith("GET /a%2Fb/caf%C3%A9?q=%20x&r=1 HTTP/1.1\r\n")
    assert (direct.status, direct.body) == (200, b"page")
    assert list(direct.headers.items()) == list(via_client.headers.items())  # X-Twice merged to "1, 2", as httpx does
    assert direct.headers["x-twice"] == "1, 2"
    assert server.connections == 1  # one pool: the two paths share keep-alive connections


def test_direct_get_decodes_gzip_with_httpx_decoders_and_a_corrupt_stream_is_their_error():
    body = gzip.compress(b"<html>caf\xc3\xa9</html>")
    direct, _ = _run(lambda n: _ok(body, "Content-Encoding: gzip"), lambda client, base: _direct_get(client, base + "/"))
    assert direct.body == b"<html>caf\xc3\xa9</html>"
    exc, _ = _run(lambda n: _ok(b"not gzip at all", "Content-Encoding: gzip"),
                  lambda client, base: _direct_get(client, base + "/"))
    assert type(exc) is httpx.DecodingError
    assert classify_exception(exc, headers_received=True) == ("retry", "decoding_error")


def test_direct_get_maps_a_body_cut_short_and_a_hang_up_like_the_client_path():
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this"
    exc, _ = _run(lambda n: (cut, "close"), lambda client, base: _direct_get(client, base + "/"))
    assert type(exc) is httpx.RemoteProtocolError and str(exc.request.url).endswith("/")
    assert classify_exception(exc, headers_received=True) == ("retry", "incomplete_body")
    exc, server = _run(lambda n: None, lambda client, base: _direct_get(client, base + "/"))
    assert type(exc) is httpx.RemoteProtocolError and len(server.heads) == 1
    assert str(exc.request.url).endswith("/") and classify_exception(exc, headers_received=False) == (
        "retry", "connection_error")



def test_direct_get_releases_a_response_whose_body_is_not_read():
    """Error pages are dropped unread: each release frees its connection (a pool of 2, 6 requests)."""

    async def six(client, base):
        responses = []  # all kept alive: only release() can give a connection back (not aiohttp's __del__)
        for _ in range(6):
            response = await client._transport.get(httpx.URL(base + "/"), client.headers, client.timeout.as_dict())
            responses.append(response)
            response.release()  # body not read, as PageFetcher does with an error page
        return [r.status for r in responses]

    def reply(n):  # a body still arriving: aiohttp cannot hand the connection back by itself
        return b"HTTP/1.1 500 Oops\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 1000

    statuses, server = _run(reply, six)
    assert statuses == [500] * 6
    assert len(server.heads) == 6
    assert server.connections == 6  # each released connection was closed (its body unread), none reused


@pytest.mark.parametrize(
    ("reply", "error", "reason"),
    [
        (lambda n: None, httpx.RemoteProtocolError, "connection_error"),  # hangs up before any answer
        (lambda n: b"HTTQ/9 what\r\n\r\n", httpx.RemoteProtocolError, "connection_error"),  # malformed status line
        (lambda n: b"HTTP/1.1 200 OK\r\nX-Big: " + b"x" * 70_000 + b"\r\n\r\n", httpx.RemoteProtocolError,
         "connection_error"),  # header line beyond aiohttp's limit
    ],
    ids=["hang-up", "bad-status-line", "huge-header"],
)
def test_broken_answers_become_the_httpx_error_for_them(reply, error, reason):
    exc, server = _run(reply, lambda client, base: client.get(base + "/"))
    assert type(exc) is error
    assert len(server.heads) == 1  # sent once: no silent resend by aiohttp (the fetcher retries)
    assert isinstance(exc.__cause__, Exception) and type(exc.__cause__).__module__.startswith("aiohttp")
    assert classify_exception(exc, headers_received=False) == ("retry", reason)


def _refused(scheme: str) -> tuple[httpx.ConnectError, int]:
    """The error of a request to a port nothing listens on, and the port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def main():
        async with httpx.AsyncClient(transport=AiohttpTransport(max_connections=1)) as client:
            await client.get(f"{scheme}://127.0.0.1:{port}/")

    with pytest.raises(httpx.ConnectError) as raised:
        asyncio.run(main())
    return raised.value, port


def test_refused_connection_is_a_connect_error_not_a_timeout():
    error, port = _refused("http")
    assert classify_exception(error, headers_received=False) == ("retry", "connection_error")
    # aiohttp's "ssl:default" (its TLS setting) said nothing of a plain-http site but suggested TLS
    assert str(error).startswith(f"Cannot connect to host 127.0.0.1:{port} [") and "ssl" not in str(error)


def test_a_refused_tls_connection_reads_the_same_in_every_run():
    """aiohttp's text names the TLS context by its repr ("ssl:<ssl.SSLContext object at
    0x7f...>"): the address differs per process, so the same failure gave dead letters of
    different reasons. The address is dropped."""
    from scrape_assets.errors import exception_text

    error, port = _refused("https")
    assert f"127.0.0.1:{port} ssl:<ssl.SSLContext object> [" in str(error)  # the transport's own message
    text = exception_text(error)
    assert text.startswith(f"ConnectError: Cannot connect to host 127.0.0.1:{port} ssl:<ssl.SSLContext object> [")
    assert " at 0x" not in text


def test_exception_text_is_one_line_without_addresses_and_bounded():
    from scrape_assets.errors import exception_text

    assert exception_text(OverflowError("date value out of range")) == "OverflowError: date value out of range"
    assert exception_text(KeyError()) == "KeyError"
    assert exception_text(ValueError("a\n  <foo.Bar object at 0xDEADbeef> b")) == "ValueError: a <foo.Bar object> b"
    assert exception_text(ValueError("x" * 500), limit=20) == "ValueError: xxxxx..."


def test_read_timeout_is_a_read_timeout():
    async def silent(client, base):
        return await client.get(base + "/", timeout=0.3)

    async def main():
        server = await asyncio.start_server(lambda r, w: asyncio.sleep(5), "127.0.0.1", 0)  # accepts, never answers
        base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with httpx.AsyncClient(transport=AiohttpTransport(max_connections=1)) as client:
            try:
                await silent(client, base)
            finally:
                server.close()

    with pytest.raises(httpx.ReadTimeout) as raised:
        asyncio.run(main())
    assert classify_exception(raised.value, headers_received=False) == ("retry", "timeout")


def test_max_connections_must_be_positive():
    with pytest.raises(ValueError, match="max_connections must be >= 1, got 0"):
        AiohttpTransport(max_connections=0)


def _through_proxy(proxy_url_for, requests):
    """Send ``requests(client)`` through a HeadServer standing in as the proxy; return (result, proxy)."""

    async def main():
        async with HeadServer(lambda n: _ok(f"via proxy {n}".encode())) as proxy:
            transport = AiohttpTransport(max_connections=2, proxy=proxy_url_for(proxy.base))
            async with httpx.AsyncClient(transport=transport, timeout=2.0) as client:
                return await requests(client), proxy

    return asyncio.run(main())


def test_requests_go_to_the_proxy_in_absolute_form_with_its_credentials():
    async def two(client):
        return [await client.get("http://catalogue.invalid/books/page-2.html?sort=a"),
                await client.get("http://catalogue.invalid/robots.txt", headers={"Proxy-Authorization": "Basic bm9wZQ=="})]

    # The .invalid host cannot resolve: only the proxy can have answered.
    responses, proxy = _through_proxy(lambda base: base.replace("http://", "http://scraper:s3cret@"), two)
    assert [r.text for r in responses] == ["via proxy 1", "via proxy 2"]
    heads = [h.decode().split("\r\n") for h in proxy.heads]
    assert [h[0] for h in heads] == ["GET http://catalogue.invalid/books/page-2.html?sort=a HTTP/1.1",
                                     "GET http://catalogue.invalid/robots.txt HTTP/1.1"]
    assert all(h.count("Proxy-Authorization: Basic c2NyYXBlcjpzM2NyZXQ=") == 1 for h in heads)  # base64(scraper:s3cret)
    assert not any("bm9wZQ" in line for h in heads for line in h)  # the configured credentials replace a caller's
    assert all("Host: catalogue.invalid" in h for h in heads)
    assert proxy.connections == 1  # one kept-alive connection to the proxy


def test_proxy_without_credentials_sends_no_proxy_authorization():
    responses, proxy = _through_proxy(lambda base: base, lambda client: client.get("http://catalogue.invalid/"))
    assert responses.text == "via proxy 1"
    assert b"Proxy-Authorization" not in proxy.heads[0]


def test_a_proxy_refusing_the_connect_tunnel_is_a_proxy_error_without_credentials():
    async def main():
        async with HeadServer(lambda n: b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n") as proxy:
            transport = AiohttpTransport(max_connections=1, proxy=proxy.base.replace("http://", "http://scraper:s3cret@"))
            async with httpx.AsyncClient(transport=transport, timeout=2.0, headers={"User-Agent": "ua/1"}) as client:
                with pytest.raises(httpx.TransportError) as raised:
                    await client.get("https://shop.invalid/catalogue/page-1.html")
                return raised.value, proxy

    exc, proxy = asyncio.run(main())
    head = proxy.heads[0].decode().split("\r\n")
    assert head[0] == "CONNECT shop.invalid:443 HTTP/1.1"
    assert "Proxy-Authorization: Basic c2NyYXBlcjpzM2NyZXQ=" in head and "User-Agent: ua/1" in head
    assert type(exc) is httpx.ProxyError
    assert "403" in str(exc) and proxy.base in str(exc)  # names the proxy and its answer...
    assert "s3cret" not in str(exc) and "scraper" not in str(exc)  # ...not the credentials (dead letters keep it)
    assert exc.__cause__ is None and exc.__context__ is None  # aiohttp's error holds Proxy-Authorization
    assert classify_exception(exc, headers_received=False) == ("retry", "proxy_error")


def _answers_over_tls(heads: list[str]):
    """A connection handler answering every request "over TLS" (its request heads go to ``heads``)."""

    async def handle(reader, writer):
        try:
            while True:
                heads.append((await reader.readuntil(b"\r\n\r\n")).decode())
                writer.write(_ok(b"over TLS"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return handle


def test_https_pages_go_through_a_connect_tunnel_that_the_origin_never_sees_the_credentials_of():
    import trustme  # a test dependency (pyproject's [test] extra)

    ca = trustme.CA()
    origin_heads: list[str] = []
    origin = _answers_over_tls(origin_heads)

    async def main():
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("shop.test").configure_cert(server_ctx)
        origin_server = await asyncio.start_server(origin, "127.0.0.1", 0, ssl=server_ctx)
        origin_port = origin_server.sockets[0].getsockname()[1]
        connects: list[str] = []

        async def tunnel(reader, writer):  # a CONNECT proxy: one tunnel per connection
            connects.append((await reader.readuntil(b"\r\n\r\n")).decode())
            upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", origin_port)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

            async def pipe(src, dst):
                try:
                    while data := await src.read(65536):
                        dst.write(data)
                        await dst.drain()
                except ConnectionError:
                    pass
                finally:
                    dst.close()

            await asyncio.gather(pipe(reader, upstream_w), pipe(upstream_r, writer))

        proxy_server = await asyncio.start_server(tunnel, "127.0.0.1", 0)
        proxy_url = f"http://scraper:s3cret@127.0.0.1:{proxy_server.sockets[0].getsockname()[1]}"
        client_ctx = ssl.create_default_context()
        ca.configure_trust(client_ctx)
        try:
            transport = AiohttpTransport(max_connections=2, verify=client_ctx, proxy=proxy_url)
            async with httpx.AsyncClient(transport=transport, timeout=3.0) as client:
                return [(await client.get(f"https://shop.test:{origin_port}/{p}")).text for p in ("a", "b")], connects
        finally:
            proxy_server.close()
            origin_server.close()

    texts, connects = asyncio.run(main())
    assert texts == ["over TLS", "over TLS"]
    assert len(connects) == 1 and connects[0].startswith("CONNECT shop.test:")  # one kept-alive tunnel
    assert "Proxy-Authorization: Basic c2NyYXBlcjpzM2NyZXQ=" in connects[0]
    assert [h.split("\r\n")[0] for h in origin_heads] == ["GET /a HTTP/1.1", "GET /b HTTP/1.1"]
    assert not any("Proxy-Authorization" in h for h in origin_heads)  # the credentials stop at the proxy


def test_credentials_with_reserved_characters_reach_the_proxy_intact():
    responses, proxy = _through_proxy(lambda base: base.replace("http://", "http://us%40er:pa/ss#w?rd@"),
                                      lambda client: client.get("http://catalogue.invalid/"))
    assert responses.text == "via proxy 1"
    assert "Proxy-Authorization: Basic dXNAZXI6cGEvc3Mjdz9yZA==" in proxy.heads[0].decode()  # "us@er:pa/ss#w?rd"


@pytest.mark.parametrize("proxy", ["https://user:hunter2@egress.corp:3128", "socks5://egress.corp:1080",
                                   "egress.corp:3128", "http://egress.corp:3128/path", "http://:3128",
                                   "http://egress.corp", "http://egress.corp:0", "http://egress.corp:99999",
                                   "http://a:b:3128", "http://user:hunter2@egress.corp:3128?x=1"])
def test_a_proxy_that_is_not_an_http_forward_proxy_url_is_refused_without_showing_it(proxy):
    with pytest.raises(ValueError, match=r"proxy: expected an http://\[user:pass@\]host:port proxy URL") as raised:
        AiohttpTransport(max_connections=1, proxy=proxy)
    assert "hunter2" not in str(raised.value) and "egress.corp" not in str(raised.value)


def test_proxy_variables_of_the_environment_are_ignored(monkeypatch):
    async def main():
        async with HeadServer(lambda n: _ok(b"direct")) as server:
            for name in ("NO_PROXY", "no_proxy"):
                monkeypatch.delenv(name, raising=False)
            for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
                monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
            async with httpx.AsyncClient(transport=AiohttpTransport(max_connections=1), timeout=2.0) as client:
                return (await client.get(server.base + "/")).text

    assert asyncio.run(main()) == "direct"


def test_https_is_verified_with_httpx_certifi_context_built_once_on_the_first_https_request(monkeypatch):
    """verify=True: https requests get httpx's context (certifi's CAs); plain http never builds one (~50 ms)."""
    import trustme

    ca = trustme.CA()
    built: list[ssl.SSLContext] = []

    def trusting_test_ca() -> ssl.SSLContext:  # stands in for certifi's CAs, which do not know this CA
        context = ssl.create_default_context()
        ca.configure_trust(context)
        built.append(context)
        return context

    tls = _answers_over_tls([])

    async def main():
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
        server = await asyncio.start_server(tls, "127.0.0.1", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        try:
            async with HeadServer(lambda n: _ok(b"plain")) as plain:
                transport = AiohttpTransport(max_connections=2)
                async with httpx.AsyncClient(transport=transport, timeout=3.0) as client:
                    texts = [(await client.get(plain.base + "/")).text]
                    contexts_after_http = len(built)
                    monkeypatch.setattr(httpx, "create_ssl_context", trusting_test_ca)
                    texts += [(await client.get(f"https://127.0.0.1:{port}/{p}")).text for p in ("a", "b")]
                untrusted = AiohttpTransport(max_connections=2)  # certifi's real CAs: this CA is unknown
                monkeypatch.undo()
                async with httpx.AsyncClient(transport=untrusted, timeout=3.0) as client:
                    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                        await client.get(f"https://127.0.0.1:{port}/c")
                return texts, contexts_after_http
        finally:
            server.close()

    texts, contexts_after_http = asyncio.run(main())
    assert texts == ["plain", "over TLS", "over TLS"]
    assert contexts_after_http == 0 and len(built) == 1  # none for http; one for both https requests


@pytest.mark.parametrize(
    ("reply", "text"),
    [
        # aiohttp's C parser words these (its pure-Python one, AIOHTTP_NO_EXTENSIONS=1, words them
        # otherwise: "Bad status line 'HTTQ/9 what'", "Invalid HTTP header: ...", "zz")
        (lambda n: b"HTTQ/9 what\r\n\r\n", "malformed response: Bad status line: Expected HTTP/, RTSP/ or ICE/: b'HTTQ/9 what'"),
        (lambda n: (b"HTTP/1.1 200 OK\r\nContent-Length 1000\r\n\r\n", "close"),
         "malformed response: Invalid header token: b'Content-Length 1000'"),
        (lambda n: (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n", "close"),
         "malformed response: Invalid character in chunk size: b'zz'"),
        (lambda n: (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10, "close"),
         "Response payload is not completed: Not enough data to satisfy content length header (received 10 of 1000 bytes)."),
        (lambda n: (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc", "close"),
         "Response payload is not completed: Not enough data to satisfy transfer length header."),
        (lambda n: (b"HTTP/1.1 200 OK\r\nSet-Cookie: sid=SECRET\r\nContent-Le", "close"),
         "Server disconnected before the response's headers were complete"),
    ],
    ids=["bad-status-line", "bad-header", "bad-chunk-size", "short-body", "short-chunk", "cut-in-headers"],
)
def test_a_refused_answer_reads_as_the_parsers_message_without_its_own_400_or_the_url(reply, text):
    """aiohttp words these "400, message=..., url=...": a 400 the server never sent, in a dead
    letter; and a hang-up inside the headers as a dump of the headers read, cookies included."""
    exc, _ = _run(reply, lambda client, base: client.get(base + "/p?key=q1w2"))
    assert type(exc) is httpx.RemoteProtocolError
    if os.environ.get("AIOHTTP_NO_EXTENSIONS") and text.startswith("malformed response: "):
        assert str(exc).startswith("malformed response: ")
    elif os.environ.get("AIOHTTP_NO_EXTENSIONS") and text.startswith("Server disconnected"):
        assert str(exc) == "Server disconnected"  # the pure-Python parser hands over no headers
    else:
        assert str(exc) == text
    assert "400" not in str(exc) and "q1w2" not in str(exc) and "SECRET" not in str(exc)


# Behaviours a mutation audit found unpinned (each test fails on its mutation).
def test_direct_get_sends_the_host_as_httpx_writes_it_trailing_dot_included():
    """An absolute-form request through a proxy names the host twice: both as written (aiohttp drops the dot)."""
    _, proxy = _through_proxy(lambda base: base, lambda client: _direct_get(client, "http://catalogue.invalid./books/"))
    head = proxy.heads[0].decode().split("\r\n")
    assert head[0] == "GET http://catalogue.invalid./books/ HTTP/1.1"
    assert head[1] == "Host: catalogue.invalid."


def test_direct_get_keeps_no_cookie_from_a_named_host():
    """aiohttp's own jar refuses cookies of IP addresses only: through a proxy the host has a name."""
    async def main():
        async with HeadServer(lambda n: _ok(b"page", "Set-Cookie: session=abc; Path=/")) as proxy:
            async with httpx.AsyncClient(transport=AiohttpTransport(max_connections=1, proxy=proxy.base)) as client:
                bodies = [(await _direct_get(client, f"http://shop.example/{n}")).body for n in range(2)]
            return bodies, proxy

    bodies, proxy = asyncio.run(main())
    assert bodies == [b"page", b"page"]
    assert not any(b"cookie:" in head.lower() for head in proxy.heads)


def test_direct_get_does_not_follow_a_redirect_itself():
    """The fetcher decides which redirects to follow (same origin only): the transport returns the 302."""
    async def requests(client, base):
        return await _direct_get(client, base + "/old")

    reply = {1: b"HTTP/1.1 302 Found\r\nLocation: /new\r\nContent-Length: 0\r\n\r\n"}
    direct, server = _run(lambda n: reply.get(n, _ok(b"new")), requests)
    assert (direct.status, direct.headers["location"], direct.body) == (302, "/new", b"")
    assert len(server.heads) == 1


def test_a_closed_transport_opens_a_new_pool_when_used_again():
    async def main():
        async with HeadServer(lambda n: _ok(f"page {n}".encode())) as server:
            transport = AiohttpTransport(max_connections=1)
            texts = []
            for _ in range(2):
                async with httpx.AsyncClient(transport=transport, timeout=2.0) as client:
                    texts.append((await client.get(server.base + "/")).text)
            return texts

    assert asyncio.run(main()) == ["page 1", "page 2"]
