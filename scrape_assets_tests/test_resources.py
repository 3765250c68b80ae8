"""build_resources: SCRAPE_* settings wired into the resources, secrets as EnvVar (never plain config)."""

from __future__ import annotations

import dagster as dg

from scrape_assets.defs.resources import SiteResource, build_resources


def test_proxy_url_is_wired_as_an_env_var_and_left_out_of_the_fetch_config(monkeypatch):
    monkeypatch.setenv("SCRAPE_PROXY_URL", "http://scraper:s3cret@proxy.internal:3128")
    site = build_resources()["site"]
    assert site.proxy_url == dg.EnvVar("SCRAPE_PROXY_URL")  # resolved at run time, not stored in run config
    assert "proxy" not in str(site.fetch_config())

    @dg.asset
    def route(site: SiteResource) -> str:  # the value a step sees, and what its log would say
        return site.describe_route()

    result = dg.materialize([route], resources={"site": site})
    assert result.output_for_node("route") == "http://demo.scrape-assets.invalid/ through proxy http://proxy.internal:3128"


def test_without_proxy_url_fetches_go_direct(monkeypatch):
    monkeypatch.delenv("SCRAPE_PROXY_URL", raising=False)
    site = build_resources()["site"]
    assert site.proxy_url is None
    assert site.describe_route() == "http://demo.scrape-assets.invalid/"
