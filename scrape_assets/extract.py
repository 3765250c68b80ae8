"""Turn a snapshot's saved pages into product rows: storage in, rows out, no network.

``parsed_products`` calls :func:`extract_snapshot` for the latest complete snapshot of a
partition and saves the result next to it as ``parsed.json`` (:func:`save_parsed`). The
partition's *parse state* (``{site}/{category}/parse_state.json``) then records which
snapshot's ``parsed.json`` is current and its *input version* (the snapshot's data
version plus the parser's code version: :data:`PARSER_VERSION` and the spec's parsing
rules, :func:`parser_code_version`). ``products_table`` and ``dead_letters`` read the
current rows with :func:`load_current`. When a new snapshot has the same input version
(every page unchanged, same parser), nothing is re-parsed: the state keeps pointing at
the earlier ``parsed.json``. Because only saved pages are read, a backfill after a parser
fix makes zero HTTP requests.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from decimal import Decimal

import orjson

from scrape_assets.counts import listed
from scrape_assets.errors import ManifestError
from scrape_assets.manifest import Manifest, load_manifest
from scrape_assets.parsing import parse_listing
from scrape_assets.spec import SiteSpec
from scrape_assets.storage import ObjectStore

#: Bump when the parsing rules change: with the spec's rules, it is the ``code_version`` of
#: ``parsed_products`` (:func:`parser_code_version`).
#: 3: cards beyond the warehouse's columns (scrape_assets/limits.py), product links that are
#: no URL and prices not above zero are rejects (parse dead letters) instead of loaded or
#: failing the step; a product listed twice keeps its first listing; a redirected page's
#: links resolve against its final URL; a 3-letter word next to a price is its currency
#: only if ISO 4217 lists it (and it suits the symbol, if any).
#: 4: a page with no product card and none of the listing's elements (pager, next link,
#: results count) fails the schema's unrecognised_page check when the spec names a results
#: count, instead of emptying its category (a bot check or an error page served as 200).
#: 5: prices: "1.250" is ambiguous (a reject; the spec's decimal_mark settles it), "99p",
#: "£.99", "1 234,50 €", "1’234", a minus sign, "C$"/"US $"-style dollars, a symbol the
#: spec's currency is written with ("$" on a CAD site) is that currency, a price with
#: U+FFFD is a reject; "Page 1 of 1,234"; browsers' codecs for legacy labels, bytes
#: invalid in UTF-8 read as windows-1252; line breaks separate words in text fields;
#: mirror URLs matched by origin.
#: 6: a rating may be a whole number 1..5 in its text ("4", "4/5", "4 of 5", "4 out of 5
#: stars") when no word One..Five is there; a product_id reject shows its regex as written.
#: 7: text after a block element's end is a new word in text fields ("<p>In stock</p>Ships"
#: is "In stock Ships", was "In stockShips").
#: 8: also where the block is nested in an inline element ("<a><h3>Title</h3></a>Ships"), and
#: for the HTML Standard's other block-level elements (blockquote, nav, pre, figure, ...);
#: a script's or style sheet's text inside a text field is left out ("In stock<script>...").
#: 9: prices: a percentage never, a range's low end, of several numbers the first a currency
#: marks, ``<sup>`` cents, struck-through text skipped, other currency signs name their code
#: (or reject), digits of two elements running together reject; U+FFFD in a title or
#: availability rejects; ``<base href>``; a results element without a number shows no
#: listing; ``listing_moved`` also says a page lists only products of earlier pages.
#: 10: a page whose header names another charset than its ``<meta>``'s UTF-8 is read as
#: UTF-8 when its bytes are valid UTF-8 and not ASCII alone (was: by the header, mojibake
#: under Shift_JIS or KOI8-R that no check saw).
PARSER_VERSION = "10"


@dataclass
class ParsedSnapshot:
    """Rows parsed from one snapshot.

    Attributes:
        products: one dict per product with the columns of ``schemas.PRODUCT_COLUMNS``.
        pages: one dict per done page: ``category, page_number, products_parsed, cards_found,
            site_claims_products, listing_recognised`` (the layout guards' input).
        rejects: product cards that could not be parsed: ``url, page_number, reason``, and
            ``product_id`` when the card's id was read before the field that failed (or the
            card repeats a product listed before). A reject without one is a card whose id
            could not be read: ``products_table`` then keeps every earlier row the snapshot
            did not see, as it cannot tell which product the card was.
        listing_moved: None, or why the snapshot may not have seen every product although
            every page was fetched, parts joined by "; ": its pages disagree about the
            listing's size (``"page 1 says 32 results, page 2 says 52"``: the listing changed
            while its pages were fetched, a crawl resumed hours later, a long crawl), so a
            product may have moved onto a page fetched before it or not fetched at all; a
            page lists nothing but products of earlier pages (``"page 2 only lists products
            of earlier pages"``: page 1 served again, the site ignoring the page number or
            redirecting back). ``products_table`` then keeps the earlier rows of products
            not seen, as after a failed page (as it does when the snapshot has fewer cards
            than page 1's results count).
    """

    category: str
    snapshot_id: str
    parser_version: str = PARSER_VERSION
    products: list[dict] = field(default_factory=list)
    pages: list[dict] = field(default_factory=list)
    rejects: list[dict] = field(default_factory=list)
    listing_moved: str | None = None


def parsed_key(manifest: Manifest) -> str:
    """Storage key of a snapshot's parsed rows: ``{site}/{category}/{snapshot_id}/parsed.json``."""
    return f"{manifest.prefix}/parsed.json"


def extract_snapshot(
    store: ObjectStore, manifest: Manifest, spec: SiteSpec, *, fetch_base_url: str
) -> ParsedSnapshot:
    """Parse every ``done`` page of a snapshot.

    A product listed more than once in the snapshot (it moved between pages while they were
    fetched, or the site repeats a card on every page) keeps its first listing as its row;
    each other listing is recorded in ``rejects`` (``already listed on page N``: a parse dead
    letter, to see), but counts as parsed on its page: not in the rejected share, not a page
    without products for the layout guard. Pages that disagree on the listing's results
    count or page count, and a page listing only products of earlier pages, set
    ``listing_moved`` (see :class:`ParsedSnapshot`); a listing that shows neither count
    cannot be checked against it. Results counts are left out of that comparison
    when they are figures of each page (:func:`_page_figures`): the spec's ``results_count``
    then reads "Showing 13-24 of 32" as 13, not the listing's total.

    Args:
        fetch_base_url: the base the pages were fetched from; product URLs on it are
            rewritten onto the spec's canonical ``base_url`` (a mirror does not change identity).

    Raises:
        ManifestError: a page marked done is missing from storage, or its saved body is not
            the size the manifest recorded (the next ``raw_pages`` run fetches such a page
            again, see :class:`~scrape_assets.crawl.PartitionCrawler`).
    """
    out = ParsedSnapshot(category=manifest.category, snapshot_id=manifest.snapshot_id)
    seen: dict[str, int] = {}  # product_id -> the page it was first listed on
    repeated: list[int] = []  # pages listing nothing but products of earlier pages
    sizes: dict[str, dict[int, int]] = {"results": {}, "pages": {}}  # what each page says the listing holds
    for n, entry in sorted(manifest.pages.items()):
        if entry.status != "done":
            continue
        try:
            body = store.read_bytes(manifest.body_key(n))
        except FileNotFoundError:
            raise ManifestError(manifest.key, f"page {n} is marked done but {manifest.body_key(n)} is missing; "
                                "the next raw_pages run fetches it again") from None
        if entry.bytes is not None and len(body) != entry.bytes:  # cut short (a full disk, a copy by hand)
            raise ManifestError(manifest.key, f"page {n}'s saved body {manifest.body_key(n)} is {len(body):,} bytes, "
                                f"the manifest recorded {entry.bytes:,}: damaged; the next raw_pages run fetches it "
                                "again (never reusing a copy of the wrong size)")
        page = parse_listing(
            body,
            spec,
            entry.final_url or entry.url,  # relative links are relative to where the page was served
            canonical_base_url=spec.base_url,
            fetch_base_url=fetch_base_url,
            content_type=entry.content_type,
        )
        listed_before = 0  # this page's products already listed on an earlier page
        for product in page.products:
            if (first := seen.get(product["product_id"])) is not None:
                # Listed twice (a product that moved between pages during the crawl, a card
                # repeated on every page): the first listing is the row, the others rejects.
                out.rejects.append({"url": product["url"], "page_number": n, "product_id": product["product_id"],
                                    "reason": f"product_id {product['product_id']}: already listed on page {first}"})
                listed_before += first != n
                continue
            seen[product["product_id"]] = n
            out.products.append(
                {
                    "category": manifest.category,
                    **product,
                    "page_number": n,
                    "snapshot_id": manifest.snapshot_id,
                    "fetched_at": entry.body_fetched_time,  # a 304 since does not move it
                }
            )
        for reject in page.rejects:
            out.rejects.append({"url": reject.url or entry.url, "page_number": n, "reason": reject.reason,
                                **({"product_id": reject.product_id} if reject.product_id else {})})
        if page.products and listed_before == len(page.products) and not page.rejects:
            repeated.append(n)  # page 1 again (the site ignored the page number, a redirect back), or a cache
        if page.pager.results_count is not None:
            sizes["results"][n] = page.pager.results_count
        if page.pager.total_pages is not None:
            sizes["pages"][n] = page.pager.total_pages
        claims = page.pager.total_pages is not None or bool(page.pager.results_count)
        # A bot check or an error page served as 200 has no card and none of the listing's
        # elements; without a results count in the spec an empty listing may show none either.
        recognised = page.cards_found > 0 or page.pager.shows_listing or not spec.pagination.results_count
        out.pages.append(
            {
                "category": manifest.category,
                "page_number": n,
                "products_parsed": len(page.products),  # a product listed again is parsed, not a rejected card
                "cards_found": page.cards_found,
                "site_claims_products": claims,
                "listing_recognised": recognised,
            }
        )
    cards = {row["page_number"]: row["cards_found"] for row in out.pages}
    if _page_figures(sizes["results"], cards):  # not the listing's total
        sizes["results"] = {}
    moved = [_listing_moved(sizes)]
    if repeated:
        moved.append(f"{_pages(repeated)} only {'lists' if len(repeated) == 1 else 'list'} products of earlier pages")
    out.listing_moved = "; ".join(m for m in moved if m) or None
    return out


def _pages(numbers: list[int]) -> str:
    """``"page 2"``, ``"pages 2, 3 and 5"``."""
    return f"page{'s' if len(numbers) > 1 else ''} {listed([str(n) for n in numbers])}"


def _page_figures(counts: dict[int, int], cards: dict[int, int]) -> bool:
    """Whether the results counts read on each page (``{page number: count}``) are figures of
    the page rather than the listing's total: they differ, and every one is the page's own
    number of cards, or its first or last position (page 1's cards a page), as a spec reading
    "Showing 20 of 35", "Showing 21-40 of 45" or "Showing 40 of 45" takes the first number.
    Only such evidence drops them: counts that differ otherwise are totals that changed while
    the pages were fetched (a card repeated on every page, or featured on page 1, does not
    hide a change)."""
    if len(set(counts.values())) < 2:
        return False
    per_page = cards.get(1)
    shapes = [lambda n: cards.get(n)]
    if per_page:  # positions need page 1's size
        shapes += [lambda n: (n - 1) * per_page + 1, lambda n: (n - 1) * per_page + cards.get(n, 0)]
    return any(all(count == shape(n) for n, count in counts.items()) for shape in shapes)


def _listing_moved(sizes: dict[str, dict[int, int]]) -> str | None:
    """How a snapshot's pages disagree about the listing's size, or None when they agree.

    Args:
        sizes: ``{"results": {page number: results count}, "pages": {page number: N of "Page
            X of N"}}``, for the pages that show each (a page showing neither is left out).

    Returns:
        e.g. ``"page 1 says 32 results, page 2 says 52; page 1 says 2 pages, page 2 says 3"``:
        for each measure the first page that shows it against the first that differs.
    """
    parts = []
    for unit, by_page in sizes.items():
        pages = sorted(by_page)
        if not pages:
            continue
        first = pages[0]
        other = next((n for n in pages if by_page[n] != by_page[first]), None)
        if other is not None:
            parts.append(f"page {first} says {by_page[first]:,} {unit}, page {other} says {by_page[other]:,}")
    return "; ".join(parts) or None


def encode_parsed(parsed: ParsedSnapshot) -> bytes:
    """``parsed.json``'s bytes: compact UTF-8 JSON (orjson, RFC 8259), prices as decimal strings.

    Read back by :func:`load_parsed`. orjson encodes the ~2,000 rows of a 100-page partition
    ~10x faster than :mod:`json` (it was a tenth of a worker's time per partition). Types
    orjson does not encode itself go through :func:`_decimal_as_str`: a Decimal becomes its
    exact string, anything else raises ``TypeError``.
    """
    payload = {
        "category": parsed.category,
        "snapshot_id": parsed.snapshot_id,
        "parser_version": parsed.parser_version,
        "products": parsed.products,  # Decimal prices through _decimal_as_str
        "pages": parsed.pages,
        "rejects": parsed.rejects,
    }
    if parsed.listing_moved is not None:  # absent in the usual case (and in files written before the field)
        payload["listing_moved"] = parsed.listing_moved
    return orjson.dumps(payload, default=_decimal_as_str)


def _decimal_as_str(value: object) -> str:
    """orjson's hook for types it does not know: a Decimal as its exact string, nothing else."""
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def save_parsed(store: ObjectStore, manifest: Manifest, parsed: ParsedSnapshot | bytes) -> int:
    """Write ``parsed.json`` next to the snapshot atomically; return bytes written.

    Args:
        parsed: the rows, or their bytes from :func:`encode_parsed`.
    """
    data = parsed if isinstance(parsed, bytes) else encode_parsed(parsed)
    store.sweep_temp_files(manifest.prefix, names=["parsed.json"])  # left by a crash in an earlier write
    return store.write_bytes_atomic(parsed_key(manifest), data)


@dataclass(frozen=True)
class ParseState:
    """Which ``parsed.json`` is current for a partition, and what it was parsed from."""

    snapshot_id: str  # the snapshot holding the current parsed.json
    input_version: str  # data version of the pages + parser version
    latest_snapshot_id: str  # the latest complete snapshot it stands for (may be newer)
    validated: bool = False  # the rows passed the pandera schema (products_table loads only these)
    products: int = 0  # rows in parsed.json
    rejects: int = 0  # product cards the parser rejected (dead letters of stage "parse")
    #: when that latest snapshot was completed (UTC ISO 8601): its day is the price_history
    #: day (None in a state written before the field: the snapshot id's day)
    latest_completed_at: str | None = None
    #: the spec's validation.max_rejected_share the verdict was given under (None in a state
    #: written before the field): another share validates the saved rows again
    max_rejected_share: float | None = None
    #: how the parsed pages disagree on the listing's size (ParsedSnapshot.listing_moved), so
    #: a run that reuses the rows still says so; None when they agree (or written before the field)
    listing_moved: str | None = None


_PARSE_STATE_FIELDS = frozenset(f.name for f in fields(ParseState))


def parse_rules_digest(spec: SiteSpec) -> str:
    """12 hex digits of the SHA-256 of the spec's parsing rules: ``base_url``, ``currency``,
    ``selectors``, ``pagination``, ``product_id`` (and ``decimal_mark`` when set). Politeness,
    categories, incremental, validation and collapse settings do not count."""
    rules = spec.model_dump_json(include={"base_url", "currency", "selectors", "pagination", "product_id"})
    if spec.decimal_mark is not None:  # (unset, the digest is what it was before the field existed)
        rules += f"|decimal_mark={spec.decimal_mark}"
    return hashlib.sha256(rules.encode()).hexdigest()[:12]


def parser_code_version(spec: SiteSpec) -> str:
    """The parser as a whole, ``"<PARSER_VERSION>+spec<parse_rules_digest>"`` (e.g.
    ``"8+spec1a2b3c4d5e6f"``): ``parsed_products``' Dagster ``code_version``, so a parser fix
    and an edit of the spec's parsing rules alike mark it stale in the UI once the
    definitions are reloaded."""
    return f"{PARSER_VERSION}+spec{parse_rules_digest(spec)}"


def input_version(manifest: Manifest, spec: SiteSpec) -> str:
    """What a parse depends on: the pages' content (data version), the parser's code
    (:data:`PARSER_VERSION`) and the spec's parsing rules (:func:`parse_rules_digest`):
    ``"<data version>+parser<parser_code_version>"``."""
    return f"{manifest.data_version}+parser{parser_code_version(spec)}"


def _state_key(site: str, category: str) -> str:
    return f"{site}/{category}/parse_state.json"


def load_parse_state(store: ObjectStore, site: str, category: str) -> ParseState | None:
    """The partition's parse state, or None before its first parse.

    Raises:
        ManifestError: the file is not a parse state (not JSON, other keys), naming it and
            the remedy: it is derived, so deleting it makes the next parse start afresh.
    """
    key = _state_key(site, category)
    try:
        raw = store.read_bytes(key)
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
        # Keys a later version adds are ignored (a rollback keeps reading its states); a
        # missing required one, or no JSON object at all, is an unreadable state.
        return ParseState(**{k: v for k, v in data.items() if k in _PARSE_STATE_FIELDS})
    except (ValueError, TypeError, AttributeError) as exc:  # torn by hand, or another program's file
        raise ManifestError(f"{store.describe()}/{key}", f"unreadable parse state ({exc}); it is derived from the "
                            "saved pages: delete it, and the next parsed_products run parses this category again") from None


def save_parse_state(store: ObjectStore, site: str, category: str, state: ParseState) -> None:
    """Write ``{site}/{category}/parse_state.json`` atomically."""
    store.sweep_temp_files(f"{site}/{category}", names=["parse_state.json"])  # left by a crash in an earlier write
    store.write_bytes_atomic(_state_key(site, category), json.dumps(state.__dict__).encode())


def load_current(store: ObjectStore, site: str, category: str) -> tuple[ParsedSnapshot, ParseState]:
    """The partition's current parsed rows and their parse state.

    Raises:
        ManifestError: the partition has never been parsed (materialize parsed_products first).
    """
    state = load_parse_state(store, site, category)
    if state is None:
        raise ManifestError(
            _state_key(site, category), "partition not parsed yet: materialize parsed_products for it first"
        )
    return load_parsed(store, load_manifest(store, site, category, state.snapshot_id)), state


def load_parsed(store: ObjectStore, manifest: Manifest, *, decimal_prices: bool = True) -> ParsedSnapshot:
    """Read ``parsed.json`` of a snapshot (prices back to :class:`~decimal.Decimal`).

    Args:
        decimal_prices: False leaves each price as the exact decimal string stored in
            ``parsed.json`` (e.g. ``"51.77"``), for a loader that binds it as a number
            anyway (``products_table``: SQLite's ``Numeric`` binding gives the same float
            from the string as from the Decimal). It also skips copying each row: loading
            200,000 rows took ~0.3 s less alone, ~0.1 s less in a run (benchmarks/analysis.md).

    Raises:
        ManifestError: the snapshot has not been parsed yet (materialize ``parsed_products`` first).
    """
    try:
        data = orjson.loads(store.read_bytes(parsed_key(manifest)))
    except FileNotFoundError:
        raise ManifestError(
            parsed_key(manifest), "snapshot not parsed yet: materialize parsed_products for this partition first"
        ) from None
    products = [{**p, "price": Decimal(p["price"])} for p in data["products"]] if decimal_prices else data["products"]
    return ParsedSnapshot(
        category=data["category"],
        snapshot_id=data["snapshot_id"],
        parser_version=data["parser_version"],
        products=products,
        pages=data["pages"],
        rejects=data["rejects"],
        listing_moved=data.get("listing_moved"),
    )
