"""ProxyURL: what SCRAPE_PROXY_URL accepts, and credentials kept apart from the address."""

from __future__ import annotations

import pytest

from scrape_assets.proxies import ProxyURL


@pytest.mark.parametrize(
    ("url", "address", "authorization"),
    [
        ("http://egress.corp:3128", "http://egress.corp:3128", None),
        ("http://egress.corp:3128/", "http://egress.corp:3128", None),
        ("http://10.0.0.7:8080", "http://10.0.0.7:8080", None),
        ("http://[::1]:3128", "http://[::1]:3128", None),
        ("http://scraper:s3cret@egress.corp:3128", "http://egress.corp:3128", "Basic c2NyYXBlcjpzM2NyZXQ="),
        ("http://us%40er:pa%2Fss@egress.corp:3128", "http://egress.corp:3128", "Basic dXNAZXI6cGEvc3M="),  # us@er:pa/ss
        ("http://user:pa/ss@w#rd@egress.corp:3128", "http://egress.corp:3128", "Basic dXNlcjpwYS9zc0B3I3Jk"),  # unencoded
        ("http://token@egress.corp:3128", "http://egress.corp:3128", "Basic dG9rZW46"),  # "token:"
        ("http://@egress.corp:3128", "http://egress.corp:3128", None),  # empty credentials: none
    ],
)
def test_valid_urls_give_the_address_and_the_basic_credentials(url, address, authorization):
    proxy = ProxyURL.parse(url)
    assert (proxy.address, proxy.authorization) == (address, authorization)
    assert "s3cret" not in repr(proxy) and "pa/ss" not in repr(proxy)


@pytest.mark.parametrize(
    "url",
    ["", "egress.corp:3128", "https://egress.corp:3128", "socks5://egress.corp:1080", "http://egress.corp",
     "http://egress.corp:", "http://egress.corp:0", "http://egress.corp:65536", "http://egress.corp:3128/path",
     "http://egress.corp:3128?x=1", "http://egress.corp:3128#f", "http://:3128", "http://a:b:3128",
     "http://user:hunter2@egress.corp", "http://[::1:3128", "http://egress.corp:\uff13\uff11\uff12\uff18",
     "http://egress.corp:\u00b3", "http://u:p@egress\\corp:1", "http://égress.corp:1", "http://egress%2ecorp:1"],
)
def test_anything_else_is_refused_without_echoing_it(url):
    with pytest.raises(ValueError, match=r"^expected an http://\[user:pass@\]host:port proxy URL") as raised:
        ProxyURL.parse(url)
    assert "hunter2" not in str(raised.value) and "egress" not in str(raised.value)
