"""Site specs: a catalogue site described as configuration (YAML).

A spec names the site, its base URL, its categories (partition key -> listing start
path, relative to the base URL), the CSS selectors for a product card and its fields,
the pager, and how to derive a product id. Two specs ship in ``scrape_assets/sites/``:
``demo`` (the built-in catalogue) and ``books_toscrape`` (https://books.toscrape.com/).

Load one with :func:`load_spec`; every problem raises :class:`~scrape_assets.errors.SpecError`
naming the file, the key and what was expected.
"""

from __future__ import annotations

import re
import string
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urljoin, urlsplit

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from scrape_assets.currencies import is_price_currency
from scrape_assets.errors import SpecError, UnknownSiteError
from scrape_assets.hostnames import host_name_problem
from scrape_assets.yaml_models import parse_yaml_model, read_text_file

#: Partition keys double as storage path segments: keep them boring.
PARTITION_KEY_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
PartitionKey = Annotated[str, StringConstraints(pattern=PARTITION_KEY_PATTERN)]


def _regex(value: str) -> re.Pattern[str]:
    """Compile a regular expression from a spec, or raise the ValueError pydantic reports."""
    try:
        return re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from exc


def _css(value: str | None) -> str | None:
    """Check a CSS selector the way the parser will use it (selectolax's lexbor engine), or raise ValueError."""
    if value is None:
        return None
    from selectolax.lexbor import LexborHTMLParser, SelectolaxError

    try:
        LexborHTMLParser("<p></p>").css_first(value)
    except SelectolaxError as exc:
        raise ValueError(f"not a CSS selector selectolax (lexbor) can parse: {exc}") from None
    return value


class _Strict(BaseModel):
    # strict: YAML 1.1 reads yes/no/on/off as booleans; "max_pages: yes" is not 1, "obey_robots_txt: 0" not False
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def http_host(url: str) -> str | None:
    """The host name of an absolute http(s) URL (None: another scheme, no host, a port that is not a number, or unparsable)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return None
    return parts.hostname if parts.scheme in ("http", "https") else None


def base_url_problem(url: str) -> str | None:
    """What a fetch base URL (``SCRAPE_BASE_URL``, the ``site`` resource's ``base_url``) should be,
    when ``url`` is not that; None when it is. The value itself is never in the text (user
    info or a query may hold a secret)."""
    if not (host := http_host(url)):
        return "an absolute http(s) URL with a host, e.g. http://127.0.0.1:8000/"
    if problem := host_name_problem(host):  # as the fetcher checks each page's host
        return f"an absolute http(s) URL whose host is a host name or IP address ({problem})"
    parts = urlsplit(url)  # parsable: http_host read it
    if "@" in parts.netloc:
        # Every page would be refused (credentials are not sent) and the URL stored in manifests and dead letters.
        return "a URL without user:password@ (credentials in URLs are not sent; a site behind a login is out of scope)"
    if parts.query or parts.fragment or url.rstrip().endswith(("?", "#")):
        return "a URL without a query or fragment (pages are resolved against the base URL's path; a query is dropped)"
    return None


class Field_(_Strict):
    """Where one product field lives inside a card: a CSS selector, and an attribute or the text.

    Written as a mapping (``{css: h3 > a, attr: href}``), or as a plain selector string, which
    takes the element's text (``price: p.price_color`` is ``{css: p.price_color}``).
    """

    css: str = Field(min_length=1)
    attr: str | None = None

    _valid_css = field_validator("css")(_css)

    @field_validator("attr")
    @classmethod
    def _attribute_name(cls, value: str | None) -> str | None:
        """HTML attribute names are case-insensitive and the parser lower-cases them: ``HREF``
        is ``href`` (else it could never match)."""
        if value is None:
            return None
        if not value.strip() or any(c.isspace() or c in "\"'>/=" for c in value.strip()):
            raise ValueError(f"expected an attribute name such as 'href' or 'title', got {value!r}")
        return value.strip().lower()

    @model_validator(mode="before")
    @classmethod
    def _plain_selector(cls, value):
        if isinstance(value, str):
            return {"css": value}
        if not isinstance(value, dict):
            raise ValueError(f"expected a CSS selector, or a mapping such as {{css: 'h3 > a', attr: href}}, "
                             f"got {value!r}")
        return value


class Selectors(_Strict):
    """CSS selectors (as understood by selectolax / lexbor) for a listing page."""

    product: str = Field(min_length=1, description="one element per product card")
    title: Field_
    url: Field_
    price: Field_
    rating: Field_ = Field(description="element whose class holds a word One..Five, or whose text is a "
                                       "whole number 1..5 ('4', '4/5', '4 of 5', '4 out of 5 stars')")
    availability: Field_

    _valid_css = field_validator("product")(_css)


class Pagination(_Strict):
    """How listing pages chain together.

    ``page_url`` is a pattern with ``{n}`` resolved against the listing's start URL
    (``page-{n}.html`` turns ``.../mystery_3/index.html`` into ``.../mystery_3/page-2.html``);
    with it, all N pages are known from page 1's pager. Without it, ``next`` links are followed.
    """

    pager: str | None = Field(default=None, description='element whose text is "Page X of N"')
    pager_regex: str = r"Page\s+(\d+)\s+of\s+(\d+)"
    next_link: str | None = Field(default=None, description="<a> whose href is the next page")
    page_url: str | None = None
    results_count: str | None = Field(
        default=None,
        description='element whose text is the number of results ("32"), on every listing page, an empty one too '
                    '("0 results"): a page with neither it nor a product card fails the unrecognised_page check',
    )
    max_pages: int = Field(default=1000, ge=1, le=100_000)

    @field_validator("pager_regex")
    @classmethod
    def _regex_has_two_groups(cls, value: str) -> str:
        if _regex(value).groups != 2:
            raise ValueError("expected a regular expression with 2 groups (current page, total pages)")
        return value

    _valid_css = field_validator("pager", "next_link", "results_count")(_css)

    @field_validator("page_url")
    @classmethod
    def _pattern_has_n(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            parsed = [(name, spec) for _, name, spec, _ in string.Formatter().parse(value) if name is not None]
            fields = {name for name, _spec in parsed}
            wide = any(re.search(r"[1-9]\d{3}", spec or "") for _name, spec in parsed)
            if not wide:  # {n:999999999} would build a gigabyte per page URL (or raise MemoryError)
                value.format(n=2)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):  # an unmatched brace, a format spec
            # int cannot take, {n[0]} or {n.x} (pydantic reports only ValueError: others escaped load_spec bare)
            fields = None
        if fields != {"n"}:
            raise ValueError("expected a pattern whose only placeholder is {n} (write '{{' for a literal '{'), "
                             "e.g. 'page-{n}.html'")
        if wide:
            raise ValueError("expected a field width under 1,000 in {n}, e.g. 'page-{n:03d}.html'")
        return value


class ProductId(_Strict):
    """Derive a product id from the product URL with a regex whose first group is the id."""

    source: Literal["url"] = "url"
    regex: str

    @field_validator("regex")
    @classmethod
    def _one_group(cls, value: str) -> str:
        if _regex(value).groups < 1:
            raise ValueError("expected a regular expression with a capturing group for the id")
        return value


#: Bounds of a site's per-host limits, in a spec and in ``SCRAPE_REQUESTS_PER_SECOND`` /
#: ``SCRAPE_MAX_CONCURRENCY`` alike (sanity: a typo of a few zeros is refused, not obeyed;
#: the slowest rate, one request every 1,000 s, is about 17 minutes a page).
MIN_REQUESTS_PER_SECOND = 0.001
MAX_REQUESTS_PER_SECOND = 100_000
MAX_CONCURRENCY = 256

#: What a ``User-Agent`` may hold, said when one cannot be sent.
USER_AGENT_EXPECTED = ("printable ASCII text, not blank, at most 512 characters (RFC 9110 §10.1.5: product tokens "
                       "and comments, e.g. 'acme-prices/1.0 (+mailto:ops@example.com)'; HTTP clients send no "
                       "other characters: write 'ö' as 'oe')")


def user_agent_problem(value: str) -> str | None:
    """Why ``value`` cannot be sent as a ``User-Agent`` header (None: it can).

    httpx encodes header values as ASCII and refuses control characters (CR and LF would
    split the request), so a value with any character outside printable ASCII (U+0020 to
    U+007E) would fail only at the first request; a blank one names nobody. See
    :data:`USER_AGENT_EXPECTED`.
    """
    if not value.strip():
        return "blank"
    if len(value) > 512:
        return f"{len(value)} characters"
    bad = next((c for c in value if not " " <= c <= "~"), None)
    if bad is not None:
        return f"character {bad!r} (U+{ord(bad):04X}) is not printable ASCII"
    return None


class Politeness(_Strict):
    """Per-host limits; overridable by ``SCRAPE_REQUESTS_PER_SECOND`` / ``SCRAPE_MAX_CONCURRENCY``."""

    requests_per_second: float = Field(default=1.0, ge=MIN_REQUESTS_PER_SECOND, le=MAX_REQUESTS_PER_SECOND)
    max_concurrency: int = Field(default=2, ge=1, le=MAX_CONCURRENCY)
    obey_robots_txt: bool = True


class Incremental(_Strict):
    """How a new snapshot decides that pages are unchanged since the previous one.

    ``every_page`` (default): every page is asked again with a conditional GET (RFC 9110
    §13.1: ``If-None-Match`` / ``If-Modified-Since``); a 304 or an identical content hash
    reuses the stored body. Exact, one request per page.

    ``first_page``: when page 1 of a category is unchanged (304 or same hash) and the
    previous complete snapshot had every page done, pages 2..N are adopted from it without
    a request (recorded ``assumed_unchanged``). One request per unchanged category instead of
    one per page; right only for sites whose listing pages change together (a price change
    on page 5 that leaves page 1 as it was is missed until page 1 changes). Needs the pager
    and ``page_url`` (pages known from page 1); next-link crawls ask every page.

    ``sitemap``: the site's XML sitemap (``sitemap``: a path relative to the base URL, or
    from the site's root with a leading ``/``; when the spec names none, the ``Sitemap:``
    lines of the site's robots.txt, else ``sitemap.xml``; the sitemaps.org protocol, see
    :mod:`scrape_assets.sitemap`) is fetched once per run (with a conditional GET when an
    earlier run kept it), and a saved page whose URL it
    lists with a ``lastmod`` no later than the saved copy (its ``Last-Modified``, else an
    hour before its fetch) is adopted without a request (recorded ``assumed_unchanged``).
    Page 1 of each category is always revalidated, and is the check: when the sitemap does
    not date it, or it changed although the sitemap says it did not, no page of that
    category is adopted. Pages the sitemap does not list (or lists without ``lastmod``) are
    revalidated; a sitemap that cannot be fetched or read makes the run revalidate every
    page (a warning says why). Exact as far as the site keeps ``lastmod`` current; one
    request per category plus the sitemap on an unchanged day, whatever the number of
    pages, so it is what makes a refresh cheap under a rate limit. Works with pager and
    next-link crawls.

    ``max_days_without_request`` (both opt-ins): a page whose saved copy was fetched longer
    ago than this is asked again (with a conditional GET) rather than adopted, so a change
    the site never announced is caught within that many days.
    """

    revalidate: Literal["every_page", "first_page", "sitemap"] = "every_page"
    sitemap: str = Field(default="sitemap.xml", min_length=1,
                         description="the sitemap (or sitemap index): relative to base_url, or /path from the "
                                     "site's root; for revalidate: sitemap. Unset: the robots.txt's Sitemap: "
                                     "lines, else sitemap.xml")
    max_days_without_request: int = Field(default=7, ge=1, le=365)

    @field_validator("sitemap")
    @classmethod
    def _on_the_site(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme or parts.netloc or ".." in parts.path.split("/"):
            raise ValueError("expected a path on the site without '..', such as 'sitemap.xml' or '/sitemap_index.xml'")
        return value

    @model_validator(mode="after")
    def _sitemap_needs_its_mode(self) -> Incremental:
        if "sitemap" in self.model_fields_set and self.revalidate != "sitemap":
            raise ValueError(f"'sitemap' is used only with 'revalidate: sitemap' (revalidate is {self.revalidate!r}): "
                             "set that, or remove 'sitemap'")
        return self


#: Default of ``validation.max_rejected_share`` (the schema check's fallback too).
DEFAULT_MAX_REJECTED_SHARE = 0.05


def _from_0_to_1(value: float, what: str, example: str) -> float:
    """``value`` when it lies in [0, 1]; else the ValueError pydantic reports, naming ``what``."""
    if not 0 <= value <= 1:
        raise ValueError(f"expected {what} from 0 to 1 ({example}), got {value}")
    return value


class Validation(_Strict):
    """Site-specific thresholds of the schema check (``parsed_products_match_schema``).

    ``max_rejected_share``: the share of a partition's product cards that may be rejected
    (a field unreadable) before the check fails (and more than 2 cards); raise it for a
    site where some cards legitimately lack a price or rating. Changing it (up or down)
    validates each partition's saved rows again at its next parse run, without parsing
    (a partition whose pages changed is parsed and validated anyway).
    """

    max_rejected_share: float = Field(default=DEFAULT_MAX_REJECTED_SHARE, allow_inf_nan=False)

    @field_validator("max_rejected_share")
    @classmethod
    def _a_fraction(cls, value: float) -> float:
        return _from_0_to_1(value, "a fraction", "0.05 is 5%")


class Collapse(_Strict):
    """Thresholds of ``success_rate_collapse_sensor`` for this site (page success rates, 0 to 1).

    ``floor``: a category's or a whole run's rate below it alerts. ``max_drop``: so does a
    rate more than this below the median of its last 5 runs (after 3). With a rate near
    1.0, a drop beyond ``1 - floor`` is below the floor anyway: the drop rule matters for a
    site whose usual rate is below 1 (pages that 404 every day), once ``floor`` is set
    under that usual rate; a category that always sits below the floor alerts once, then
    never again until it has recovered above it.
    """

    floor: float = Field(default=0.9, allow_inf_nan=False)
    max_drop: float = Field(default=0.3, allow_inf_nan=False)

    @field_validator("floor", "max_drop")
    @classmethod
    def _a_rate(cls, value: float) -> float:
        return _from_0_to_1(value, "a success rate", "0.9 is 90%")


class SiteSpec(_Strict):
    """One site. See the module docstring and ``scrape_assets/sites/*.yaml``."""

    name: Annotated[str, StringConstraints(pattern=PARTITION_KEY_PATTERN)]
    base_url: str
    currency: str = Field(default="GBP", description="ISO 4217 code when a price has no symbol")
    decimal_mark: Literal[".", ","] | None = Field(
        default=None,
        description='the decimal mark of the site\'s prices; the other of "." and "," groups thousands. Unset: '
                    'guessed per price ("1,250" is 1250; "1.250" is ambiguous and rejects the card)',
    )
    categories: dict[PartitionKey, str] = Field(min_length=1)
    selectors: Selectors
    pagination: Pagination = Pagination()
    product_id: ProductId
    politeness: Politeness = Politeness()
    incremental: Incremental = Incremental()
    validation: Validation = Validation()
    collapse: Collapse = Collapse()

    @field_validator("currency")
    @classmethod
    def _iso_4217(cls, value: str) -> str:
        if not is_price_currency(value):
            raise ValueError("expected an ISO 4217 currency code such as 'EUR' or 'GBP'")
        return value

    @field_validator("base_url")
    @classmethod
    def _absolute_http_url(cls, value: str) -> str:
        # The same rules as SCRAPE_BASE_URL's: a query or fragment would swallow the paths
        # joined to it, user info would be stored with every page (and refused by the site).
        if problem := base_url_problem(value):
            raise ValueError(f"expected {problem}")
        return value if value.endswith("/") else value + "/"

    @field_validator("categories")
    @classmethod
    def _relative_paths(cls, value: dict[str, str]) -> dict[str, str]:
        for key, path in value.items():
            parts = urlsplit(path)
            if parts.netloc or parts.scheme or path.startswith("/") or ".." in path.split("/"):
                raise ValueError(
                    f"category {key!r}: expected a path relative to base_url, with no leading '/', no scheme or "
                    f"host and no '..' (e.g. 'shop/c/kitchen/index.html'; write 'a:b' as './a:b'), got {path!r}"
                )
        return value

    @model_validator(mode="after")
    def _first_page_needs_the_page_list(self) -> SiteSpec:
        pagination = self.pagination
        if self.incremental.revalidate == "first_page" and not (pagination.pager and pagination.page_url):
            raise ValueError("incremental.revalidate 'first_page' needs pagination.pager and pagination.page_url "
                             "(page 1 must say how many pages there are; a next-link crawl asks every page): set "
                             "them, or use revalidate: sitemap, which works with next links")
        return self

    def start_url(self, category: str, base_url: str | None = None) -> str:
        """Absolute URL of page 1 of ``category``, on ``base_url`` (default: the spec's)."""
        try:
            path = self.categories[category]
        except KeyError:
            raise SpecError(
                self.name, "categories", f"unknown category {category!r}; known: {', '.join(self.categories)}"
            ) from None
        return urljoin(base_url or self.base_url, path)


def shipped_spec_names() -> list[str]:
    """Names of the specs shipped in ``scrape_assets/sites/`` (``demo``, ``books_toscrape``)."""
    folder = resources.files("scrape_assets.sites")
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def parse_spec(text: str, source: str) -> SiteSpec:
    """Parse and validate spec YAML.

    Args:
        text: the YAML document.
        source: file path or name used in error messages.

    Returns:
        The validated :class:`SiteSpec`.

    Raises:
        SpecError: the YAML is malformed or a key is missing, unknown or of the wrong type;
            the message names ``source``, the dotted key and what was expected.
    """
    def explain(error: dict, key: str | None):
        if error["type"] == "string_pattern_mismatch" and error["loc"][:1] == ("categories",):
            return key, f"category keys must match {PARTITION_KEY_PATTERN} (lower-case letters, digits, '-', '_')"
        return None

    return parse_yaml_model(
        text,
        source,
        SiteSpec,
        unknown_key_hint="check the spelling against scrape_assets/sites/demo.yaml",
        explain=explain,
    )


def load_spec(name_or_path: str) -> SiteSpec:
    """Load a shipped spec by name (``demo``) or a spec file by path (``./my_site.yaml``).

    Raises:
        SpecError: unknown name, unreadable file, or invalid content.
    """
    if name_or_path in shipped_spec_names():
        text = resources.files("scrape_assets.sites").joinpath(f"{name_or_path}.yaml").read_text("utf-8")
        return parse_spec(text, f"{name_or_path} (scrape_assets/sites/{name_or_path}.yaml)")
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return parse_spec(read_text_file(path, "spec file"), str(path))
    raise UnknownSiteError(
        name_or_path, f"a shipped spec name ({', '.join(shipped_spec_names())}) or a path to a .yaml file"
    )
