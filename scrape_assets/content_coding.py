"""Content codings of HTTP bodies (RFC 9110 §8.4.1): decoded whole, checked to their end, bounded.

The client offers :data:`ACCEPT_ENCODING` (gzip, deflate, br) and decodes every body itself
with :func:`decode_body`, not with httpx's decoders, which accept a stream cut short: httpx
0.28's deflate and brotli decoders never check that the stream reached its end, and its
gzip decoder reads only a stream's first member. A page whose compressed stream stops early
(a broken CDN or compressing proxy, inside an otherwise complete HTTP message) would be
saved as a whole page holding half its products, and a robots.txt cut that way would lose
its later rules; here both are a :class:`httpx.DecodingError`, as a corrupt stream is.
"""

from __future__ import annotations

import zlib

import brotli
import httpx

#: What the client offers in ``Accept-Encoding``: the codings :func:`decode_body` reads.
#: Set on the client explicitly, so it does not depend on which optional packages
#: (``brotli``, ``zstandard``) httpx finds installed.
ACCEPT_ENCODING = "gzip, deflate, br"
#: Content codings that compress (IANA HTTP Content Coding Registry): a body in one the client
#: did not offer cannot be read.
COMPRESSIONS = frozenset({"gzip", "x-gzip", "deflate", "br", "zstd", "compress", "x-compress", "dcb", "dcz", "exi",
                          "pack200-gzip"})
#: The codings :func:`decode_body` decodes (x-gzip is gzip, RFC 9110 §8.4.1.3).
DECODED = frozenset({"gzip", "x-gzip", "deflate", "br"})
_GZIP_MAGIC = b"\x1f\x8b"
#: Most members a gzip body may have (RFC 1952 §2.2 sets none): BGZF, the most member-happy
#: producer, writes one per 64 KiB, 160 for a 10 MB page; a body of thousands of empty
#: members is an attack on the decoder, not a page.
MAX_GZIP_MEMBERS = 10_000
#: Bytes of a gzip body fed to zlib at a time (see :func:`_gunzip`).
_WINDOW = 16 * 1024


class BodyTooLarge(Exception):
    """A body decodes to more than the bytes allowed (a decompression bomb, or a large page)."""


def codings(content_encoding: str) -> list[str]:
    """The codings of a ``Content-Encoding`` value, in the order they were applied, lower
    case; ``identity`` and empty items left out."""
    return [c for c in (item.strip().lower() for item in content_encoding.split(",")) if c and c != "identity"]


def transfer_coded(transfer_encoding: str) -> bool:
    """Whether a ``Transfer-Encoding`` value names a coding other than ``chunked`` (``gzip,
    chunked``): aiohttp undoes chunked only, and this client sends no ``TE`` asking for any
    other (RFC 9112 §6.1), so such a body would reach the caller still coded."""
    return any(c != "chunked" for c in codings(transfer_encoding))


def decode_body(body: bytes, content_encoding: str, max_bytes: int, *, truncate: bool = False,
                complete: bool = True) -> bytes:
    """``body`` with the codings of ``content_encoding`` undone, last applied first.

    gzip and x-gzip read every member of a multi-member stream (RFC 1952 §2.2) and ignore
    bytes after the last member that start none, as gzip(1) does (a body ending inside the
    next member's two-byte magic is cut short, as gzip -t says too); deflate is the zlib format
    (RFC 9110 §8.4.1.2), or raw deflate as some servers send it (httpx reads both); br is
    Brotli (RFC 7932). Names that are no compression (``identity``, a server's ``UTF-8``)
    are skipped, as httpx and aiohttp skip them: such a body is what was sent.

    Args:
        body: the bytes as received (an empty body is returned as is).
        content_encoding: the response's ``Content-Encoding`` value ("" for none).
        max_bytes: most bytes any decoding step may produce. No step expands more than
            ``max_bytes + 1`` bytes in memory (Brotli: up to 64 KiB more, its last block),
            however small the input (a bomb is never expanded whole).
        truncate: return the first ``max_bytes`` bytes of a larger body (a robots.txt) instead
            of raising :class:`BodyTooLarge`; the end of a stream cut by the limit is not checked.
        complete: False when the caller stopped reading before the body's end: a stream that
            stops before its end is then no error (its decoded prefix is returned).

    Raises:
        httpx.DecodingError: the bytes are not in the coding named, or a stream stops before
            its end (a body cut short inside a complete HTTP message), as httpx names a
            corrupt stream (the fetcher retries it as ``decoding_error``).
            A compression not decoded here (zstd, compress...) is one too; the fetcher refuses
            those before reading the body (``unsupported_content_encoding``).
        BodyTooLarge: a decoding step produces more than ``max_bytes`` (without ``truncate``).
    """
    prefix = not complete
    for coding in reversed([c for c in codings(content_encoding) if c in COMPRESSIONS]):
        if not body:
            return body
        if coding not in DECODED:
            raise httpx.DecodingError(f"Content-Encoding {coding}: not decoded by this client (it offers {ACCEPT_ENCODING})")
        try:
            if coding == "br":
                body, ended = _unbrotli(body, max_bytes)
            elif coding == "deflate":
                body, ended = _inflate(body, max_bytes)
            else:
                body, ended = _gunzip(body, max_bytes)
        except (zlib.error, brotli.error) as exc:
            raise httpx.DecodingError(f"{coding} body: {exc}") from exc
        if len(body) > max_bytes:
            if not truncate:
                raise BodyTooLarge(f"Content-Encoding {content_encoding.strip()} decodes to more than {max_bytes} bytes")
            body, prefix = body[:max_bytes], True
        elif not ended and not prefix:
            raise httpx.DecodingError(f"{coding} body: the stream ends before its end (cut short?)")
    return body[:max_bytes] if truncate else body


def _gunzip(data: bytes, max_bytes: int) -> tuple[bytes, bool]:
    """``(decoded, ended)`` of a gzip stream of one or more members; at most ``max_bytes + 1``.

    Fed :data:`_WINDOW` bytes at a time: zlib copies the input left over at each member's end
    (``unused_data``), so feeding the whole body would copy it once a member, quadratic in
    a body of many tiny members. At most :data:`MAX_GZIP_MEMBERS` members are read.

    Raises:
        httpx.DecodingError: more members than :data:`MAX_GZIP_MEMBERS`.
        zlib.error: not gzip.
    """
    parts: list[bytes] = []
    produced, members, held = 0, 1, b""
    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    for start in range(0, len(data), _WINDOW):
        window, held = held + data[start:start + _WINDOW], b""
        while window:
            if decompressor.eof:  # a member ended: another may follow
                if len(window) < 2 and start + _WINDOW < len(data):
                    held = window  # too short to tell: the next window says
                    break
                if _GZIP_MAGIC.startswith(window):  # the body ends inside another member's magic: cut short
                    return b"".join(parts), False
                if not window.startswith(_GZIP_MAGIC):  # bytes after the last member: ignored
                    return b"".join(parts), True
                members += 1
                if members > MAX_GZIP_MEMBERS:
                    raise httpx.DecodingError(f"gzip body: more than {MAX_GZIP_MEMBERS} members")
                decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            out = decompressor.decompress(window, max_bytes + 1 - produced)
            parts.append(out)
            produced += len(out)
            if produced > max_bytes:
                return b"".join(parts), True
            window = decompressor.unused_data if decompressor.eof else decompressor.unconsumed_tail
    return b"".join(parts), decompressor.eof


def _inflate(data: bytes, max_bytes: int) -> tuple[bytes, bool]:
    """``(decoded, ended)`` of a deflate body: zlib format, else raw deflate; at most ``max_bytes + 1``."""
    decompressor = zlib.decompressobj()
    try:
        out = decompressor.decompress(data, max_bytes + 1)
    except zlib.error:
        decompressor = zlib.decompressobj(-zlib.MAX_WBITS)
        out = decompressor.decompress(data, max_bytes + 1)
    return out, decompressor.eof or len(out) > max_bytes


def _unbrotli(data: bytes, max_bytes: int) -> tuple[bytes, bool]:
    """``(decoded, ended)`` of a Brotli stream; at most ``max_bytes + 1`` bytes (a little more
    when Brotli's last block overshoots the buffer limit)."""
    decompressor = brotli.Decompressor()
    out = decompressor.process(data, output_buffer_limit=max_bytes + 1)
    return out, decompressor.is_finished() or len(out) > max_bytes
