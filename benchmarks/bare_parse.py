"""The re-parse baseline: a bare selectolax loop over saved pages, no framework, no checks.

For every page it reads the file, decodes it as UTF-8, parses it with selectolax (lexbor,
the pipeline's parser) and extracts the same fields with the same CSS selectors: product
id (from the URL), title, price and currency, rating, availability, URL. Rows are kept in
a list (then counted); nothing is validated or written. Only the loop is timed.

Run: ``python -m benchmarks.bare_parse --objects DIR --site bench`` parses the pages of the
latest complete snapshot of every category under ``DIR/bench`` (reading each manifest to
find them, as the pipeline does) and prints ``{"pages", "products", "seconds", "pages_per_s"}``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from decimal import Decimal
from pathlib import Path
from urllib.parse import urljoin

from selectolax.lexbor import LexborHTMLParser

from scrape_assets.manifest import latest_manifest
from scrape_assets.storage import ObjectStore

_ID = re.compile(r"_(\d+)/index\.html$")
_AMOUNT = re.compile(r"\d+(?:\.\d+)?")
_RATINGS = {"One": 1, "Two": 2, "Three": 3, "Four": 4, "Five": 5}


def page_files(objects: Path, site: str) -> list[tuple[Path, str]]:
    """``(file, page URL)`` of every done page of each category's latest complete snapshot.

    The pipeline's own manifest loader finds them (journal folded in, torn tail ignored);
    it is outside the timed loop.
    """
    store = ObjectStore(str(objects))
    out = []
    for category in sorted(p.name for p in (objects / site).iterdir() if p.is_dir()):
        manifest = latest_manifest(store, site, category, complete=True)
        if manifest is None:
            continue
        for n, entry in sorted(manifest.pages.items()):
            if entry.status == "done":
                out.append((objects / manifest.body_key(n), entry.url))
    return out


def parse_page(body: bytes, page_url: str) -> list[dict]:
    tree = LexborHTMLParser(body.decode("utf-8", errors="replace"))
    rows = []
    for card in tree.css("article.product_pod"):
        link = card.css_first("h3 > a")
        url = urljoin(page_url, link.attributes["href"])
        price_text = card.css_first("p.price_color").text().strip()
        rating = next((_RATINGS[w] for w in card.css_first("p.star-rating").attributes["class"].split() if w in _RATINGS), None)
        rows.append(
            {
                "product_id": _ID.search(url).group(1),
                "title": link.attributes["title"],
                "price": Decimal(_AMOUNT.search(price_text).group()),
                "currency": "GBP" if "£" in price_text else "?",
                "rating": rating,
                "availability": " ".join(card.css_first("p.availability").text().split()),
                "url": url,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--objects", type=Path, required=True, help="the object storage root ($SCRAPE_DATA_DIR/objects)")
    parser.add_argument("--site", default="bench")
    args = parser.parse_args(argv)
    files = page_files(args.objects, args.site)
    started = time.perf_counter()
    rows = []
    for path, url in files:
        rows.extend(parse_page(path.read_bytes(), url))
    seconds = time.perf_counter() - started
    print(json.dumps({"pages": len(files), "products": len(rows), "seconds": round(seconds, 3),
                      "pages_per_s": round(len(files) / seconds, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
