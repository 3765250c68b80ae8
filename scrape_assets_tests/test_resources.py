"""build_resources: SCRAPE_* settings wired into the resources, secrets as EnvVar (never plain config)."""

from __future__ import annotations

import dagster as dg
import pytest

from scrape_assets.defs.resources import SiteResource, build_resources
from scrape_assets.errors import SettingsError


def test_proxy_url_is_wired_as_an_env_var_and_left_out_of_the_fetch_config(monkeypatch):
    monkeypatch.setenv("SCRAPE_PROXY_URL", "http://scraper:s3cret@egress.corp:3128")
    monkeypatch.setenv("SCRAPE_BASE_URL", "http://shop.example/")
    site = build_resources()["site"]
    assert site.proxy_url == dg.EnvVar("SCRAPE_PROXY_URL")  # resolved at run time, not stored in run config
    assert "proxy" not in str(site.fetch_config()) and "egress" not in str(site.fetch_config())

    @dg.asset
    def route(site: SiteResource) -> str:  # the value a step sees, as its log line shows it
        return site.describe_route()

    result = dg.materialize([route], resources={"site": site})
    assert result.output_for_node("route") == "http://shop.example/ through proxy http://egress.corp:3128"


def test_the_in_process_demo_catalogue_never_goes_through_the_proxy():
    site = SiteResource(proxy_url="http://egress.corp:3128")  # the demo spec's base URL
    assert site.describe_route() == "http://demo.scrape-assets.invalid/"


def test_without_proxy_url_fetches_go_direct(monkeypatch):
    monkeypatch.delenv("SCRAPE_PROXY_URL", raising=False)
    site = build_resources()["site"]
    assert site.proxy_url is None and site.proxy() is None
    assert site.describe_route() == "http://demo.scrape-assets.invalid/"


def test_a_malformed_proxy_url_from_run_config_is_a_settings_error_that_hides_it():
    site = SiteResource(base_url="http://shop.example/", proxy_url="http://user:hunter2@egress.corp")  # no port
    for call in (site.describe_route, site.client):
        with pytest.raises(SettingsError, match=r"SCRAPE_PROXY_URL='<hidden>' is invalid: expected an http://") as raised:
            call()
        assert "hunter2" not in str(raised.value)
