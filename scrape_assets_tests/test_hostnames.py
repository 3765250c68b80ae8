"""host_name_problem: the one check of a URL's host the spec and the fetcher share."""

from __future__ import annotations

import httpx
import pytest

from scrape_assets.hostnames import host_name_problem


@pytest.mark.parametrize("host", [
    "shop.example", "shop.example.", "shop_1.example", "127.0.0.1", "::1", "2001:db8::1", "fe80::1%eth0",
    "xn--strae-oqa.de", "straße.de", "ü.example", "x" * 63 + ".example",
])
def test_names_and_addresses_httpx_can_send_pass(host):
    assert host_name_problem(host) is None


@pytest.mark.parametrize(("host", "problem"), [
    ("", "no host"),
    ("shop..example", "an empty label"),
    ("x" * 64 + ".example", "a label over 63 characters"),
    ("xn--", "'xn--' is no IDNA 2008 label (Malformed A-label, no Punycode eligible content found)"),
    ("www.xn--zz.example", "'xn--zz' is no IDNA 2008 label (Invalid A-label)"),
    ("xn--i-7iq.ws", "'xn--i-7iq' is no IDNA 2008 label (Codepoint U+2764 at position 2 of 'i\u2764' not allowed)"),
    ("i\u2764.ws", "not an IDNA 2008 name (Codepoint U+2764 at position 2 of 'i\u2764' not allowed)"),
    # httpx decodes a host that starts with xn-- whole, so its plain labels must be IDNA 2008 too
    ("xn--mnchen-3ya.my_shop.de", "not an IDNA 2008 name (Codepoint U+005F at position 3 of 'my_shop' not allowed)"),
])
def test_hosts_no_resolver_or_httpx_would_take_are_named(host, problem):
    assert host_name_problem(host) == problem


def test_it_agrees_with_httpx_on_what_httpx_refuses():
    """Every host httpx refuses to encode or decode is one host_name_problem names (IDNA 2008 both)."""
    for host in ("xn--zz.shop.test", "xn--i-7iq.ws", "xn--", "xn--mnchen-3ya.my_shop.de"):
        with pytest.raises(UnicodeError):
            httpx.URL(f"http://{host}/").host  # noqa: B018
        assert host_name_problem(host) is not None
    assert httpx.URL("http://stra\u00dfe.de/").raw_host == b"xn--strae-oqa.de" and host_name_problem("straße.de") is None
