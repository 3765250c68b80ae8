"""AiohttpTransport against a raw HTTP/1.1 server on 127.0.0.1: what is sent, what comes back, which error."""

from __future__ import annotations

import asyncio
import gzip
import socket

import httpx
import pytest

from scrape_assets.http_transport import AiohttpTransport
from scrape_assets.retry import classify_exception

pytestmark = pytest.mark.timeout(30)


class HeadServer:
    """Reads request heads (kept in ``heads``), answers each with ``reply(n)`` bytes (None: hang up)."""

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
                writer.write(data)
                await writer.drain()
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


def test_refused_connection_is_a_connect_error_not_a_timeout():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def main():
        async with httpx.AsyncClient(transport=AiohttpTransport(max_connections=1)) as client:
            await client.get(f"http://127.0.0.1:{port}/")

    with pytest.raises(httpx.ConnectError) as raised:
        asyncio.run(main())
    assert classify_exception(raised.value, headers_received=False) == ("retry", "connection_error")


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
                await client.get("http://catalogue.invalid/robots.txt")]

    # The .invalid host cannot resolve: only the proxy can have answered.
    responses, proxy = _through_proxy(lambda base: base.replace("http://", "http://scraper:s3cret@"), two)
    assert [r.text for r in responses] == ["via proxy 1", "via proxy 2"]
    heads = [h.decode().split("\r\n") for h in proxy.heads]
    assert [h[0] for h in heads] == ["GET http://catalogue.invalid/books/page-2.html?sort=a HTTP/1.1",
                                     "GET http://catalogue.invalid/robots.txt HTTP/1.1"]
    assert all("Proxy-Authorization: Basic c2NyYXBlcjpzM2NyZXQ=" in h for h in heads)  # base64("scraper:s3cret")
    assert all("Host: catalogue.invalid" in h for h in heads)
    assert proxy.connections == 1  # one kept-alive connection to the proxy


def test_proxy_without_credentials_sends_no_proxy_authorization():
    responses, proxy = _through_proxy(lambda base: base, lambda client: client.get("http://catalogue.invalid/"))
    assert responses.text == "via proxy 1"
    assert b"Proxy-Authorization" not in proxy.heads[0]


def test_https_urls_ask_the_proxy_for_a_connect_tunnel():
    async def main():
        async with HeadServer(lambda n: b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n") as proxy:
            transport = AiohttpTransport(max_connections=1, proxy=proxy.base.replace("http://", "http://scraper:s3cret@"))
            async with httpx.AsyncClient(transport=transport, timeout=2.0) as client:
                with pytest.raises(httpx.TransportError) as raised:
                    await client.get("https://shop.invalid/catalogue/page-1.html")
                return raised.value, proxy

    exc, proxy = asyncio.run(main())
    head = proxy.heads[0].decode().split("\r\n")
    assert head[0] == "CONNECT shop.invalid:443 HTTP/1.1"
    assert "Proxy-Authorization: Basic c2NyYXBlcjpzM2NyZXQ=" in head
    assert "403" in str(exc) and str(proxy.base.split("//")[1]) in str(exc)  # names the proxy and its answer
    assert "s3cret" not in str(exc) and exc.__cause__ is None  # not the credentials (dead letters keep messages)
    assert classify_exception(exc, headers_received=False) == ("retry", "connection_error")


@pytest.mark.parametrize("proxy", ["https://user:pw@proxy.internal:3128", "socks5://proxy.internal:1080",
                                   "proxy.internal:3128", "http://proxy.internal:3128/path", "http://:3128"])
def test_a_proxy_that_is_not_an_http_forward_proxy_url_is_refused_without_showing_credentials(proxy):
    with pytest.raises(ValueError, match="proxy must be an http://host\\[:port\\] URL") as raised:
        AiohttpTransport(max_connections=1, proxy=proxy)
    assert "pw" not in str(raised.value)


def test_proxy_variables_of_the_environment_are_ignored(monkeypatch):
    async def main():
        async with HeadServer(lambda n: _ok(b"direct")) as server:
            monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
            async with httpx.AsyncClient(transport=AiohttpTransport(max_connections=1), timeout=2.0) as client:
                return (await client.get(server.base + "/")).text

    assert asyncio.run(main()) == "direct"
