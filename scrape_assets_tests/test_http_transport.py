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
