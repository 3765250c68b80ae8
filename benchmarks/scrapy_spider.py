"""The baseline: a plain Scrapy spider over the same catalogue, writing a JSON lines feed.

It does what a Scrapy user would write for this site, with Scrapy's own parser (parsel/lxml)
and the pipeline spec's CSS selectors: start at page 1 of every category of the spec, read
"Page 1 of N" from the pager and request pages 2..N (the pipeline discovers pages the same
way), and yield one item per product card with the same fields as our rows: ``product_id,
title, price, currency, rating, availability, url, category, page_number``. Settings that
matter for the comparison: ``CONCURRENT_REQUESTS = CONCURRENT_REQUESTS_PER_DOMAIN = N``, no
AutoThrottle, no download delay, ``ROBOTSTXT_OBEY = True`` (as ours), no HTTP cache,
``LOG_LEVEL = INFO``; everything else is Scrapy's default.

Run: ``python -m benchmarks.scrapy_spider --spec SPEC.yaml --base-url URL --concurrency 16
--feed out.jsonl --stats stats.json`` (Scrapy's final stats are written to ``--stats``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from decimal import Decimal

import scrapy
import yaml
from scrapy.crawler import CrawlerProcess

_PAGER = re.compile(r"Page\s+(\d+)\s+of\s+(\d+)")
_AMOUNT = re.compile(r"\d+(?:\.\d+)?")
_CURRENCY = {"£": "GBP", "$": "USD", "€": "EUR"}
_RATINGS = {"One": 1, "Two": 2, "Three": 3, "Four": 4, "Five": 5}


def _css(field: dict | str) -> str:
    """A spec selector (``{css, attr}``) as a parsel CSS query (``h3 > a::attr(title)``)."""
    if isinstance(field, str):
        return field
    return field["css"] + (f"::attr({field['attr']})" if field.get("attr") else "")


class CatalogueSpider(scrapy.Spider):
    """Listing pages of every category -> one item per product."""

    name = "catalogue"

    def __init__(self, spec: dict, base_url: str, **kwargs):
        super().__init__(**kwargs)
        self.spec = spec
        self.base_url = base_url
        sel = spec["selectors"]
        self.q_product = sel["product"]
        self.q_title, self.q_url = _css(sel["title"]), _css(sel["url"])
        self.q_price, self.q_rating, self.q_avail = sel["price"]["css"], _css(sel["rating"]), sel["availability"]["css"]
        self.q_pager = spec["pagination"]["pager"]
        self.page_url = spec["pagination"]["page_url"]
        self.id_pattern = re.compile(spec["product_id"]["regex"])

    async def start(self):
        for category, path in self.spec["categories"].items():
            yield scrapy.Request(self.base_url + path, cb_kwargs={"category": category, "page": 1})

    def parse(self, response, category: str, page: int):
        if page == 1:
            pager = " ".join(response.css(self.q_pager + " ::text").getall())
            if match := _PAGER.search(pager):
                for n in range(2, int(match.group(2)) + 1):
                    yield response.follow(self.page_url.format(n=n), cb_kwargs={"category": category, "page": n})
        for card in response.css(self.q_product):
            url = response.urljoin(card.css(self.q_url).get())
            price_text = " ".join(card.css(self.q_price + " ::text").getall()).strip()
            symbol = next((c for s, c in _CURRENCY.items() if s in price_text), self.spec.get("currency", "GBP"))
            rating = next((_RATINGS[w] for w in card.css(self.q_rating).get("").split() if w in _RATINGS), None)
            yield {
                "category": category,
                "product_id": self.id_pattern.search(url).group(1),
                "title": card.css(self.q_title).get(),
                "price": str(Decimal(_AMOUNT.search(price_text).group())),
                "currency": symbol,
                "rating": rating,
                "availability": " ".join(" ".join(card.css(self.q_avail + " ::text").getall()).split()),
                "url": url,
                "page_number": page,
            }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--spec", required=True, help="the site spec YAML the pipeline uses")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--feed", required=True, help="JSON lines output")
    parser.add_argument("--stats", required=True, help="where Scrapy's final stats go (JSON)")
    args = parser.parse_args(argv)
    with open(args.spec, encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    process = CrawlerProcess(
        settings={
            "CONCURRENT_REQUESTS": args.concurrency,
            "CONCURRENT_REQUESTS_PER_DOMAIN": args.concurrency,
            "DOWNLOAD_DELAY": 0,
            "AUTOTHROTTLE_ENABLED": False,
            "ROBOTSTXT_OBEY": True,
            "HTTPCACHE_ENABLED": False,
            "LOG_LEVEL": "INFO",
            "USER_AGENT": "scrape-assets-bench-scrapy (+benchmarks/scrapy_spider.py)",
            "FEEDS": {args.feed: {"format": "jsonlines", "overwrite": True, "encoding": "utf8"}},
        }
    )
    crawler = process.create_crawler(CatalogueSpider)
    process.crawl(crawler, spec=spec, base_url=args.base_url if args.base_url.endswith("/") else args.base_url + "/")
    process.start()
    stats = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in crawler.stats.get_stats().items()}
    with open(args.stats, "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=1, sort_keys=True)
    return 0 if stats.get("finish_reason") == "finished" else 1


if __name__ == "__main__":
    sys.exit(main())
