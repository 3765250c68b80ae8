"""Spec loading and validation: clear errors naming the file, the key and what was expected."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scrape_assets.errors import SpecError
from scrape_assets.spec import base_url_problem, load_spec, parse_spec, shipped_spec_names


def test_shipped_specs_load():
    assert shipped_spec_names() == ["books_toscrape", "demo"]
    demo = load_spec("demo")
    assert demo.base_url == "http://demo.scrape-assets.invalid/"
    assert len(demo.categories) == 12
    books = load_spec("books_toscrape")
    assert list(books.categories)[:2] == ["all", "books"]
    assert books.categories["all"] == "catalogue/page-1.html"
    assert books.categories["travel"] == "catalogue/category/books/travel_2/index.html"
    assert books.categories["sequential-art"] == "catalogue/category/books/sequential-art_5/index.html"
    assert len(books.categories) == 52  # all + books + the 50 sidebar categories
    assert books.start_url("mystery", "http://127.0.0.1:9/") == (
        "http://127.0.0.1:9/catalogue/category/books/mystery_3/index.html"
    )


def _demo_dict() -> dict:
    from importlib import resources

    return yaml.safe_load(resources.files("scrape_assets.sites").joinpath("demo.yaml").read_text())


@pytest.mark.parametrize(
    "mutate, key, expected",
    [
        (lambda d: d.pop("base_url"), "base_url", "required key is missing"),
        (lambda d: d.update(base_url="ftp://x"), "base_url", "absolute http(s) URL"),
        (lambda d: d["selectors"].update(prodct="x"), "selectors.prodct", "unknown key"),
        (lambda d: d["selectors"].update(prodct=d["selectors"].pop("product")), "selectors.prodct", "unknown key"),
        (lambda d: d["categories"].update({"Bad Key!": "x.html"}), "categories.Bad Key!", "category keys must match"),
        (lambda d: d["categories"].update(escape="../../etc/passwd"), "categories", "no '..'"),
        (lambda d: d["categories"].update(rooted="/shop/c/kitchen/index.html"), "categories",
         "category 'rooted': expected a path relative to base_url, with no leading '/'"),
        (lambda d: d["selectors"].update(rating=["span.score"]), "selectors.rating",
         "expected a CSS selector, or a mapping such as {css: 'h3 > a', attr: href}, got ['span.score']"),
        (lambda d: d["selectors"].update(rating="span..score"), "selectors.rating.css", "not a CSS selector"),
        (lambda d: d["pagination"].update(page_url="page.html"), "pagination.page_url", "{n}"),
        (lambda d: d["pagination"].update(page_url="page-{n}-{x}.html"), "pagination.page_url",
         "only placeholder is {n}"),
        (lambda d: d["pagination"].update(page_url="page-{n}}.html"), "pagination.page_url", "only placeholder is {n}"),
        (lambda d: d["selectors"].update(product="article[[["), "selectors.product",
         "not a CSS selector selectolax (lexbor) can parse"),
        (lambda d: d["selectors"]["price"].update(css="p..price"), "selectors.price.css", "not a CSS selector"),
        (lambda d: d["pagination"].update(next_link="li.next >"), "pagination.next_link", "not a CSS selector"),
        (lambda d: d["product_id"].update(regex="("), "product_id.regex", "not a valid regular expression"),
        (lambda d: d["politeness"].update(requests_per_second=0), "politeness.requests_per_second",
         "greater than or equal to 0.001"),
        # One request every ~116 days: a typo of a few zeros, refused as SCRAPE_REQUESTS_PER_SECOND refuses it.
        (lambda d: d["politeness"].update(requests_per_second=0.0000001), "politeness.requests_per_second",
         "greater than or equal to 0.001"),
        (lambda d: d.update(validation={"max_rejected_share": 5}), "validation.max_rejected_share",
         "expected a fraction from 0 to 1 (0.05 is 5%), got 5"),
        (lambda d: d.update(validation={"max_rejected_share": -0.1}), "validation.max_rejected_share",
         "expected a fraction from 0 to 1 (0.05 is 5%), got -0.1"),
        (lambda d: d.update(validation={"max_rejected_share": float("nan")}), "validation.max_rejected_share",
         "finite number"),
        (lambda d: d.update(collapse={"floor": 90}), "collapse.floor",
         "expected a success rate from 0 to 1 (0.9 is 90%), got 90"),
        (lambda d: d.update(collapse={"max_drop": -0.3}), "collapse.max_drop",
         "expected a success rate from 0 to 1 (0.9 is 90%), got -0.3"),
        (lambda d: d.update(collapse={"flor": 0.5}), "collapse.flor", "unknown key"),
        (lambda d: d.update(incremental={"revalidate": "sometimes"}), "incremental.revalidate",
         "'every_page', 'first_page' or 'sitemap'"),
        # The base URL's rules are SCRAPE_BASE_URL's: "?lang=en/" would swallow every joined path.
        (lambda d: d.update(base_url="https://example.com/shop?lang=en"), "base_url", "without a query or fragment"),
        (lambda d: d.update(base_url="https://example.com/shop#top"), "base_url", "without a query or fragment"),
        (lambda d: d.update(base_url="http://example.com:80a/"), "base_url", "with a host"),
        (lambda d: d.update(base_url="http://:8080/"), "base_url", "with a host"),
        # the resolver's encoder refuses an empty label or one over 63 characters; httpx an xn-- that decodes to nothing
        (lambda d: d.update(base_url="http://shop..example/"), "base_url", "whose host is a host name or IP address (an empty"),
        (lambda d: d.update(base_url=f"http://{'x' * 64}.example/"), "base_url", "(a label over 63 characters)"),
        (lambda d: d.update(base_url="http://xn--zz.example/"), "base_url", "'xn--zz' is no IDNA 2008 label"),
        (lambda d: d.update(base_url="http://xn--i-7iq.ws/"), "base_url", "'xn--i-7iq' is no IDNA 2008 label"),
        (lambda d: d.update(base_url="http://u:secret@example.com/"), "base_url", "without user:password@"),
        (lambda d: d["categories"].update(wiki="Category:Travel_books"), "categories", "no scheme or host"),
        (lambda d: d["categories"].update(mail="mailto:x@y"), "categories", "write 'a:b' as './a:b'"),
        (lambda d: d["selectors"].update(url={"css": "h3 > a", "attr": ""}), "selectors.url.attr",
         "expected an attribute name such as 'href'"),
        # YAML 1.1 reads yes/no/on/off as booleans: no number or switch is made of them quietly.
        (lambda d: d["pagination"].update(max_pages=True), "pagination.max_pages", "valid integer"),
        (lambda d: d.update(validation={"max_rejected_share": True}), "validation.max_rejected_share", "valid number"),
        (lambda d: d["politeness"].update(obey_robots_txt=0), "politeness.obey_robots_txt", "valid boolean"),
        (lambda d: d["politeness"].update(obey_robots_txt="off"), "politeness.obey_robots_txt", "valid boolean"),
        # Partition keys are storage path segments: at most 64 characters, a letter or digit first.
        (lambda d: d["categories"].update({"a" * 65: "x.html"}), "categories." + "a" * 65, "category keys must match"),
        (lambda d: d["categories"].update({"-x": "x.html"}), "categories.-x", "category keys must match"),
        (lambda d: d["categories"].update({"_x": "x.html"}), "categories._x", "category keys must match"),
        (lambda d: d.update(categories={}), "categories", "at least 1 item"),
        (lambda d: d.update(name="Demo Site"), "name", "should match pattern"),
        # A bare "?" or "#" is a query or fragment too: every joined path would be swallowed by it.
        (lambda d: d.update(base_url="https://example.com/shop?"), "base_url", "without a query or fragment"),
        (lambda d: d.update(base_url="https://example.com/shop#"), "base_url", "without a query or fragment"),
        (lambda d: d.update(base_url="http://token@example.com/"), "base_url", "without user:password@"),
        (lambda d: d["selectors"].update(url={"css": "h3 > a", "attr": "href=x"}), "selectors.url.attr",
         "expected an attribute name such as 'href'"),
        (lambda d: d["selectors"].update(url={"css": "h3 > a", "attr": "href>"}), "selectors.url.attr",
         "expected an attribute name such as 'href'"),
        (lambda d: d["pagination"].update(max_pages=0), "pagination.max_pages", "greater than or equal to 1"),
        (lambda d: d["pagination"].update(max_pages=100_001), "pagination.max_pages", "less than or equal to 100000"),
        (lambda d: d["pagination"].update(pager_regex=r"Page (\d+) of (\d+) (x)"), "pagination.pager_regex",
         "expected a regular expression with 2 groups"),
        (lambda d: d["pagination"].update(pager_regex=r"Page (\d+)"), "pagination.pager_regex",
         "expected a regular expression with 2 groups"),
        # {n:s} has the one placeholder, but int refuses the format: it would fail only at page 2.
        (lambda d: d["pagination"].update(page_url="page-{n:s}.html"), "pagination.page_url",
         "only placeholder is {n}"),
        (lambda d: d["pagination"].update(page_url="page-{n}-{n.real}.html"), "pagination.page_url",
         "only placeholder is {n}"),
        # int cannot be indexed nor has .x: format raises TypeError / AttributeError, not ValueError
        (lambda d: d["pagination"].update(page_url="page-{n[0]}.html"), "pagination.page_url",
         "only placeholder is {n}"),
        (lambda d: d["pagination"].update(page_url="page-{n.x}.html"), "pagination.page_url",
         "only placeholder is {n}"),
        # a width that would build a page URL of a gigabyte (or raise MemoryError out of load_spec)
        (lambda d: d["pagination"].update(page_url="page-{n:99999999999}.html"), "pagination.page_url",
         "expected a field width under 1,000 in {n}"),
        (lambda d: d["product_id"].update(regex=r"_\d+/index\.html$"), "product_id.regex",
         "capturing group for the id (got '_\\d+/index\\.html$')"),  # as typed, not Python's '_\\\\d+'
        (lambda d: d["product_id"].update(regex="_\\d+\t/'x'"), "product_id.regex",  # a tab, a quote: escaped
         "capturing group for the id (got \"_\\\\d+\\t/'x'\")"),
        (lambda d: d["politeness"].update(requests_per_second=100_001), "politeness.requests_per_second",
         "less than or equal to 100000"),
        (lambda d: d["politeness"].update(max_concurrency=257), "politeness.max_concurrency",
         "less than or equal to 256"),
        (lambda d: d.update(incremental={"revalidate": "sitemap", "sitemap": "//cdn.example/sitemap.xml"}),
         "incremental.sitemap", "expected a path on the site"),
        (lambda d: d.update(incremental={"revalidate": "sitemap", "sitemap": ""}), "incremental.sitemap",
         "at least 1 character"),
        (lambda d: d.update(incremental={"revalidate": "sitemap", "max_days_without_request": 0}),
         "incremental.max_days_without_request", "greater than or equal to 1"),
        (lambda d: d.update(incremental={"revalidate": "sitemap", "max_days_without_request": 366}),
         "incremental.max_days_without_request", "less than or equal to 365"),
    ],
)
def test_bad_spec_names_file_key_and_expectation(tmp_path, mutate, key, expected):
    path, error = _spec_error(tmp_path, mutate)
    message = str(error)
    assert str(path) in message
    assert key in message
    assert expected in message
    assert error.key.startswith(key.split(".")[0])


def _spec_error(tmp_path, mutate) -> tuple[Path, SpecError]:
    """The demo spec changed by ``mutate``, written to a file: its path and load_spec's error."""
    data = _demo_dict()
    mutate(data)
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as info:
        load_spec(str(path))
    return path, info.value


def test_malformed_yaml_and_unknown_site(tmp_path, monkeypatch):
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="broken.yaml: not valid YAML") as info:
        load_spec(str(bad))
    assert "line 2, column 1" in str(info.value)  # where the parser gave up, whichever loader
    with pytest.raises(SpecError, match="text.yaml: not valid YAML"):
        parse_spec("name: \udcff\n", "text.yaml")  # a lone surrogate (text given, not read from a file)
    with pytest.raises(SpecError, match="unknown site: expected a shipped spec name \\(books_toscrape, demo\\)"):
        load_spec("no_such_site")
    with pytest.raises(SpecError, match="expected a mapping at the top level"):
        parse_spec("- a\n- b\n", "list.yaml")
    with pytest.raises(SpecError) as info:
        load_spec(str(tmp_path / "missing.yaml"))
    assert str(info.value) == f"{tmp_path / 'missing.yaml'}: cannot read spec file: No such file or directory"
    monkeypatch.chdir(tmp_path)  # a relative path: the message says where it was looked for
    with pytest.raises(SpecError) as info:
        load_spec("./missing.yaml")
    assert str(info.value) == f"missing.yaml: cannot read spec file {tmp_path / 'missing.yaml'}: No such file or directory"
    utf16 = tmp_path / "utf16.yaml"
    utf16.write_bytes("name: demo\n".encode("utf-16"))  # a byte-order mark 0xff 0xfe first
    with pytest.raises(SpecError) as info:
        load_spec(str(utf16))
    assert str(info.value) == f"{utf16}: expected UTF-8 text, found byte 0xff at offset 0"
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(SpecError) as info:
        load_spec(str(empty))
    assert str(info.value) == f"{empty}: expected a mapping at the top level, got an empty document (or null)"


@pytest.mark.parametrize(("extra", "key", "first", "again"), [
    ("  travel: catalogue/category/books/mystery_3/index.html\n", "travel", 28, 40),  # a partition's page
    ("politeness: {obey_robots_txt: false}\n", "politeness", 7, 40),  # a whole block replaced
])
def test_a_key_given_twice_is_refused_naming_both_lines(extra, key, first, again):
    """PyYAML keeps the last of two equal keys without a word: a second `travel:` would store
    mystery's products as travel's, a second `politeness:` drop robots.txt."""
    text = (Path(__file__).parents[1] / "scrape_assets" / "sites" / "demo.yaml").read_text("utf-8")
    assert text.splitlines()[first - 1].lstrip().startswith(f"{key}:") and len(text.splitlines()) == again - 1
    with pytest.raises(SpecError) as info:
        parse_spec(text + extra, "my_shop.yaml")
    message = str(info.value)
    assert message.startswith("my_shop.yaml: not valid YAML")
    assert f"found the key {key!r} a second time (first on line {first})" in message and f"line {again}," in message
    with pytest.raises(SpecError, match="found the key 'x' a second time"):
        parse_spec("name: demo\nflow: {x: 1, x: 2}\n", "flow.yaml")  # on one line too
    with pytest.raises(SpecError, match="flow.yaml: not valid YAML: month must be in 1..12"):
        parse_spec("name: demo\nflow: {2001-13-01: a}\n", "flow.yaml")  # a key PyYAML takes for a date
    with pytest.raises(SpecError, match="found the key 1 a second time"):
        parse_spec("name: demo\nflow: {1: a, 0x1: b}\n", "flow.yaml")  # the same value, spelled differently


def test_merge_keys_overriding_a_merged_key_are_no_duplicate():
    """`<<: *base` then `x: 2` overrides the merged x, as YAML allows; merged again elsewhere too."""
    from scrape_assets import yaml_models

    text = "defaults: {base: &b {x: 1}, p: &p {<<: *b, x: 2}}\ntop: {<<: *p}\nlist: [{<<: *b}, *p]\n"
    assert yaml.load(text, Loader=yaml_models._UniqueKeyLoader) == yaml.safe_load(text)


def test_a_page_url_pattern_may_format_n_and_escape_braces():
    from scrape_assets.spec import Pagination

    assert Pagination(page_url="p-{n:03d}.html").page_url.format(n=2) == "p-002.html"
    assert Pagination(page_url="p-{n:0999}.html").page_url == "p-{n:0999}.html"  # a width of 999, zero-filled
    assert Pagination(page_url="p{{x}}-{n}.html").page_url.format(n=2) == "p{x}-2.html"


def test_specs_parse_with_libyaml_when_available_and_read_the_same():
    """libyaml's loader (PyYAML's wheels have it) gives the same document as the pure-Python one."""
    from scrape_assets import yaml_models

    if yaml.__with_libyaml__:
        assert yaml_models._SafeLoader is yaml.CSafeLoader
    text = (Path(__file__).parents[1] / "scrape_assets" / "sites" / "demo.yaml").read_text("utf-8")
    text += "extra_anchor: &a {x: 1}\nuse: *a\ndate_like: 2026-12-01\nodd: 'it''s'\n"
    assert yaml.load(text, Loader=yaml_models._SafeLoader) == yaml.safe_load(text)


def test_every_problem_of_a_spec_is_named_in_one_error(tmp_path):
    """Two typos: both named at once (the misspelling first), so one run shows everything to fix."""
    data = _demo_dict()
    data["selectors"]["prodct"] = data["selectors"].pop("product")
    data["politeness"]["max_concurency"] = data["politeness"].pop("max_concurrency")
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as info:
        load_spec(str(path))
    message = " ".join(str(info.value).split())
    assert message.startswith(f"{path}: ") and " (also " in message, message
    for problem in ("politeness.max_concurency: unknown key", "selectors.prodct: unknown key",
                    "selectors.product: required key is missing"):
        assert problem in message, (problem, message)
    assert message.index("unknown key") < message.index("required key is missing")  # the misspelling first


@pytest.mark.parametrize("code", ["ABC", "XXX", "XAU", "eur", "EURO", "£"])
def test_the_sites_currency_must_be_an_iso_4217_code_shops_price_in(code):
    text = (Path(__file__).parents[1] / "scrape_assets" / "sites" / "demo.yaml").read_text("utf-8")
    assert "currency: GBP\n" in text
    with pytest.raises(SpecError) as info:
        parse_spec(text.replace("currency: GBP\n", f"currency: {code}\n"), "my_shop.yaml")
    assert str(info.value) == (f"my_shop.yaml: currency: expected an ISO 4217 currency code such as 'EUR' or 'GBP' "
                               f"(got {code!r})")


def test_the_currency_list_is_pycountrys_read_without_importing_it():
    """pycountry's import costs ~50 ms in every process loading the definitions; its data file ~1 ms."""
    import pycountry

    from scrape_assets.currencies import NOT_PRICES, price_currencies

    assert price_currencies() == {c.alpha_3 for c in pycountry.currencies} - NOT_PRICES
    assert {"EUR", "GBP", "USD", "JPY", "KWD", "CHF"} <= price_currencies() and len(price_currencies()) > 150
    code = ("import sys\nfrom scrape_assets.spec import load_spec\nload_spec('demo')\n"
            "from scrape_assets.parsing import parse_price\nassert parse_price('12 CHF', 'EUR')[1] == 'CHF'\n"
            "assert 'pycountry' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_field_selector_may_be_written_as_a_plain_string(tmp_path):
    """``price: p.price_color`` reads the element's text, as ``{css: p.price_color}`` does."""
    data = _demo_dict()
    data["selectors"].update(price="p.price_color", rating="span.score")
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    selectors = load_spec(str(path)).selectors
    assert (selectors.price.css, selectors.price.attr) == ("p.price_color", None)
    assert (selectors.rating.css, selectors.rating.attr) == ("span.score", None)


def test_an_attribute_name_is_read_in_lower_case_as_the_parser_keeps_it(tmp_path):
    """lexbor lower-cases attribute names: "attr: HREF" could never match; it means href."""
    data = _demo_dict()
    data["selectors"]["url"] = {"css": "h3 > a", "attr": "HREF"}
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_spec(str(path)).selectors.url.attr == "href"


def test_a_key_yaml_reads_as_a_boolean_says_to_quote_it(tmp_path):
    """categories: {no: ...} (Norway) is {False: ...} to YAML 1.1: the error says why and what to do."""
    from importlib import resources

    text = resources.files("scrape_assets.sites").joinpath("demo.yaml").read_text()
    text = text.replace("categories:\n", "categories:\n  no: catalogue/category/books/norway_99/index.html\n", 1)
    path = tmp_path / "site.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(str(path))
    assert "(got False); YAML reads an unquoted key such as no, yes, on or off as a boolean" in str(info.value)
    assert "quote it, e.g. 'no':" in str(info.value)


def test_first_page_revalidation_without_the_page_list_is_refused(tmp_path):
    """Without a pager and page_url the crawl follows next links and asks every page: the
    opt-in would quietly do nothing."""
    data = _demo_dict()
    data["incremental"] = {"revalidate": "first_page"}
    data["pagination"].pop("page_url")
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="revalidate 'first_page' needs pagination.pager and pagination.page_url"):
        load_spec(str(path))


def test_a_document_with_many_problems_counts_those_not_listed():
    """yaml_models.py: the first problem, MAX_MORE others listed, and '; and N more' counting
    only those left out."""
    import pydantic

    from scrape_assets.errors import SpecError
    from scrape_assets.yaml_models import MAX_MORE, parse_yaml_model

    class Model(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        a: int = 0

    text = "\n".join(f"k{i}: 1" for i in range(MAX_MORE + 3))  # 1 first + MAX_MORE listed + 2 more
    with pytest.raises(SpecError) as info:
        parse_yaml_model(text, "x.yaml", Model)
    assert str(info.value).count("unknown key") == 1 + MAX_MORE
    assert "; and 2 more)" in str(info.value)


def test_the_bounds_themselves_are_accepted_and_an_attribute_name_is_trimmed(tmp_path):
    """Each limit refused just past it (above) is accepted at it; ``attr: ' href '`` is href."""
    data = _demo_dict()
    data["categories"]["a" * 64] = "x.html"
    data["pagination"]["max_pages"] = 100_000
    data["politeness"].update(requests_per_second=0.001, max_concurrency=256)
    data["selectors"]["url"] = {"css": "h3 > a", "attr": " href "}
    data["incremental"] = {"revalidate": "sitemap", "max_days_without_request": 365}
    data["validation"] = {"max_rejected_share": 0}
    data["collapse"] = {"floor": 0, "max_drop": 1}
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    spec = load_spec(str(path))
    assert spec.categories["a" * 64] == "x.html" and spec.pagination.max_pages == 100_000
    assert (spec.politeness.requests_per_second, spec.politeness.max_concurrency) == (0.001, 256)
    assert spec.selectors.url.attr == "href"
    assert spec.incremental.max_days_without_request == 365
    assert (spec.validation.max_rejected_share, spec.collapse.floor, spec.collapse.max_drop) == (0, 0, 1)
    data["politeness"]["requests_per_second"] = 100_000
    data["incremental"]["max_days_without_request"] = 1
    data["validation"] = {"max_rejected_share": 1}
    data["collapse"] = {"floor": 1, "max_drop": 0}
    path.write_text(yaml.safe_dump(data))
    spec = load_spec(str(path))
    assert (spec.politeness.requests_per_second, spec.incremental.max_days_without_request) == (100_000, 1)
    assert (spec.validation.max_rejected_share, spec.collapse.floor, spec.collapse.max_drop) == (1, 1, 0)


def test_the_defaults_of_a_spec_that_leaves_the_optional_blocks_out(tmp_path):
    """A polite crawl unless the spec says otherwise: 1 request/s, 2 at a time, robots.txt obeyed."""
    data = _demo_dict()
    for key in ("currency", "politeness"):
        data.pop(key)
    for key in ("max_pages", "pager_regex"):
        data["pagination"].pop(key, None)
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    spec = load_spec(str(path))
    assert spec.currency == "GBP"
    assert (spec.politeness.requests_per_second, spec.politeness.max_concurrency, spec.politeness.obey_robots_txt) == (
        1.0, 2, True)
    assert (spec.pagination.max_pages, spec.pagination.pager_regex) == (1000, r"Page\s+(\d+)\s+of\s+(\d+)")
    assert (spec.incremental.revalidate, spec.incremental.sitemap, spec.incremental.max_days_without_request) == (
        "every_page", "sitemap.xml", 7)
    assert spec.validation.max_rejected_share == 0.05
    assert (spec.collapse.floor, spec.collapse.max_drop) == (0.9, 0.3)


def test_a_base_url_without_a_trailing_slash_is_a_folder_categories_resolve_under(tmp_path):
    """``https://shop.example/en`` means the folder /en/: a category path is joined under it,
    not in place of its last segment."""
    data = _demo_dict()
    data["base_url"] = "https://shop.example/en"
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    spec = load_spec(str(path))
    assert spec.base_url == "https://shop.example/en/"
    assert spec.start_url("travel") == "https://shop.example/en/catalogue/category/books/travel_2/index.html"


def test_an_unknown_category_names_the_known_ones():
    demo = load_spec("demo")
    with pytest.raises(SpecError) as info:
        demo.start_url("travle")
    assert info.value.key == "categories"
    assert str(info.value).startswith("demo: categories: unknown category 'travle'; known: travel, mystery, classics,")


@pytest.mark.parametrize("missing", ["pager", "page_url"])
def test_first_page_revalidation_needs_both_the_pager_and_the_page_url(tmp_path, missing):
    data = _demo_dict()
    data["incremental"] = {"revalidate": "first_page"}
    data["pagination"].pop(missing)
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="revalidate 'first_page' needs pagination.pager and pagination.page_url"):
        load_spec(str(path))


def test_a_spec_path_is_read_whatever_its_suffix_and_a_missing_yml_is_a_missing_file(tmp_path):
    """Only a bare word is taken for a shipped name: ``shop.yml`` that is not there is a file
    that cannot be read, not an unknown site; an existing file is read whatever it is called."""
    text = (Path(__file__).parents[1] / "scrape_assets" / "sites" / "demo.yaml").read_text("utf-8")
    for name in ("shop.yml", "shop.spec"):
        (tmp_path / name).write_text(text)
        assert load_spec(str(tmp_path / name)).name == "demo"
    with pytest.raises(SpecError) as info:
        load_spec(str(tmp_path / "missing.yml"))
    assert str(info.value) == f"{tmp_path / 'missing.yml'}: cannot read spec file: No such file or directory"


def test_a_user_agent_is_printable_ascii_up_to_512_characters():
    """The bounds of what httpx can send: U+0020 to U+007E (DEL and tabs are control characters)."""
    from scrape_assets.spec import user_agent_problem

    assert user_agent_problem("b" * 512) is None and user_agent_problem(" ~bot/1.0~ ") is None
    assert user_agent_problem("b" * 513) == "513 characters"
    assert user_agent_problem("bot\x7f") == "character '\\x7f' (U+007F) is not printable ASCII"
    assert user_agent_problem("bot\t1.0") == "character '\\t' (U+0009) is not printable ASCII"
    assert user_agent_problem(" \t ") == "blank"


def test_the_parsing_rules_digest_of_the_shipped_specs_is_stable():
    """The digest is part of every partition's input version: a change of how a spec is read
    (a field reordered or added with a default, a value normalised otherwise) that leaves its
    meaning alone must not change it, or every saved partition is parsed again after an
    upgrade. Update these only with a change that is meant to re-parse everything."""
    from scrape_assets.extract import parse_rules_digest

    assert parse_rules_digest(load_spec("demo")) == "bb4479fa0cc5"
    assert parse_rules_digest(load_spec("books_toscrape")) == "90595c975d60"


@pytest.mark.parametrize(("change", "ending"), [
    (lambda d: d["selectors"].update(url={"css": "h3 > a", "attr": "href=x"}),
     "selectors.url.attr: expected an attribute name such as 'href' or 'title', got 'href=x'"),
    (lambda d: d.update(collapse={"floor": 1.5}), "collapse.floor: expected a success rate from 0 to 1 (0.9 is 90%), got 1.5"),
    (lambda d: d["pagination"].update(max_pages=0), "pagination.max_pages: Input should be greater than or equal to 1 (got 0)"),
])
def test_the_bad_value_is_named_once(tmp_path, change, ending):
    """A validator whose message names the value is not followed by a second "(got ...)"."""
    path, error = _spec_error(tmp_path, change)
    assert str(error) == f"{path}: {ending}"


@pytest.mark.parametrize("base_url", ["http://xn--strae-oqa.de/", "http://stra\u00dfe.de/", "http://[::1]:8000/",
                                      "http://shop.example./"])
def test_a_base_url_on_a_valid_idna_2008_name_or_an_address_is_taken(base_url):
    """IDNA 2008 as httpx encodes hosts: xn--strae-oqa.de (straße.de) is a name Python's own idna
    codec (IDNA 2003) would map differently or refuse."""
    assert base_url_problem(base_url) is None
