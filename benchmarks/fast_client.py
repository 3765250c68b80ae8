"""The server's ceiling: a minimal keep-alive HTTP/1.1 client on raw asyncio sockets.

It does what a crawler's network layer must do and nothing else (no robots.txt, no parsing,
no storage): ``concurrency`` connections each send ``GET`` for their share of the URL list,
read the status line and headers, then exactly ``Content-Length`` bytes of body. Its
pages/s is therefore a lower bound of what the server can deliver on this machine while a
client also runs on it; when it is well above the crawlers' pages/s, the server is not
what bounds them.

Run: ``python -m benchmarks.fast_client --base-url URL --paths FILE --concurrency 16``
prints ``{"pages": N, "seconds": s, "pages_per_s": x, "bytes": b, "errors": e}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from urllib.parse import urlsplit


async def _worker(host: str, port: int, paths: list[str], totals: dict) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for path in paths:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: bench-fast-client\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length)
            totals["pages"] += 1
            totals["bytes"] += len(body)
            totals["errors"] += status != 200
    finally:
        writer.close()


async def fetch_all(base_url: str, paths: list[str], concurrency: int) -> dict:
    """Fetch every path once over ``concurrency`` keep-alive connections; return the totals."""
    parts = urlsplit(base_url)
    totals = {"pages": 0, "bytes": 0, "errors": 0}
    shares = [paths[i::concurrency] for i in range(concurrency)]
    started = time.perf_counter()
    await asyncio.gather(*(_worker(parts.hostname, parts.port, share, totals) for share in shares if share))
    seconds = time.perf_counter() - started
    return {**totals, "seconds": round(seconds, 3), "pages_per_s": round(totals["pages"] / seconds, 1),
            "mb_per_s": round(totals["bytes"] / seconds / 1e6, 1), "concurrency": concurrency}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--paths", required=True, help="file with one path per line (e.g. /catalogue/...)")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    with open(args.paths, encoding="utf-8") as f:
        paths = [line.strip() for line in f if line.strip()]
    try:
        import uvloop  # optional: a faster event loop makes the client's own ceiling higher
    except ImportError:
        result = asyncio.run(fetch_all(args.base_url, paths, args.concurrency))
    else:
        result = uvloop.run(fetch_all(args.base_url, paths, args.concurrency))
    print(json.dumps(result))
    return 0 if result["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
