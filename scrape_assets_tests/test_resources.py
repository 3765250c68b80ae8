"""build_resources: SCRAPE_* settings wired into the resources, secrets as EnvVar (never plain config)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import dagster as dg
import pytest

from scrape_assets.defs.resources import (
    AlertsResource,
    ObjectStoreResource,
    SiteResource,
    WarehouseResource,
    build_resources,
)
from scrape_assets.errors import SettingsError
from scrape_assets.warehouse import products


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


@pytest.mark.parametrize(
    ("variable", "resource", "url"),
    [
        ("SCRAPE_WAREHOUSE_URL", "warehouse", "postgresql://scraper:hunter2@db.internal/warehouse"),
        ("SCRAPE_STORAGE_URL", "store", "s3://key:hunter2@bucket/prefix"),
    ],
)
def test_a_storage_or_warehouse_url_that_is_set_reaches_dagster_as_an_env_var(monkeypatch, variable, resource, url):
    # The resources' config is what the UI (and its unauthenticated GraphQL API) shows.
    monkeypatch.setenv(variable, url)
    wired = build_resources()[resource]
    assert wired.url == dg.EnvVar(variable)
    field = wired.get_resource_definition().config_schema.as_field()
    assert field.default_value["url"] == {"env": variable} and "hunter2" not in str(field.default_value)



def test_the_alert_webhook_url_reaches_dagster_as_an_env_var_and_resolves_in_a_run(monkeypatch):
    """A Slack-style webhook's path is its credential: the resource's config (shown by the UI
    and its API) names the variable, a run gets the value."""
    url = "https://hooks.example/services/T0/B0/hunter2"
    monkeypatch.setenv("SCRAPE_ALERT_WEBHOOK_URL", url)
    wired = build_resources()["alerts"]
    assert wired.webhook_url == dg.EnvVar("SCRAPE_ALERT_WEBHOOK_URL")
    field = wired.get_resource_definition().config_schema.as_field()
    assert field.default_value["webhook_url"] == {"env": "SCRAPE_ALERT_WEBHOOK_URL"}
    assert "hunter2" not in str(field.default_value)

    @dg.asset
    def webhook(alerts: AlertsResource) -> str:
        return alerts.webhook_url

    assert dg.materialize([webhook], resources={"alerts": wired}).output_for_node("webhook") == url
    monkeypatch.delenv("SCRAPE_ALERT_WEBHOOK_URL")
    assert build_resources()["alerts"].webhook_url is None


def test_resources_built_without_settings_have_the_settings_defaults_and_a_20_s_timeout():
    """make_resources, the launchpad and a Definitions without build_resources fetch like an unset SCRAPE_*."""
    from scrape_assets.settings import load_settings

    settings, site = load_settings({}), SiteResource()
    assert (site.site, site.max_attempts, site.base_url, site.proxy_url) == (
        settings.site, settings.max_attempts, None, None)
    # No setting for it: the field's default is production's per-request timeout.
    assert site.timeout_s == build_resources()["site"].timeout_s == 20.0
    assert ObjectStoreResource(url="x").resume_max_age_h == settings.resume_max_age_h

def test_the_env_var_urls_resolve_in_a_run_and_the_defaults_stay_plain_paths(monkeypatch, tmp_path):
    for variable in ("SCRAPE_WAREHOUSE_URL", "SCRAPE_STORAGE_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path))
    defaults = build_resources()
    assert defaults["warehouse"].url == f"sqlite:///{tmp_path / 'warehouse.db'}"
    assert defaults["store"].url == str(tmp_path / "objects")

    monkeypatch.setenv("SCRAPE_WAREHOUSE_URL", f"sqlite:///{tmp_path / 'other.db'}")
    monkeypatch.setenv("SCRAPE_STORAGE_URL", str(tmp_path / "elsewhere"))
    resources = build_resources()

    @dg.asset
    def urls(warehouse: WarehouseResource, store: ObjectStoreResource) -> tuple[str, str]:
        return warehouse.url, store.url

    result = dg.materialize([urls], resources={"warehouse": resources["warehouse"], "store": resources["store"]})
    assert result.output_for_node("urls") == (f"sqlite:///{tmp_path / 'other.db'}", str(tmp_path / "elsewhere"))


def test_resume_max_age_comes_from_its_setting_with_a_20_hour_default(monkeypatch):
    from datetime import timedelta

    monkeypatch.delenv("SCRAPE_RESUME_MAX_AGE_H", raising=False)
    assert build_resources()["store"].resume_max_age() == timedelta(hours=20)
    monkeypatch.setenv("SCRAPE_RESUME_MAX_AGE_H", "1.5")
    assert build_resources()["store"].resume_max_age() == timedelta(hours=1, minutes=30)
    for bad in ("-1", "0", "inf", "nan", "1e12", "soon"):  # 0 would turn crash-resume off, even for a retry
        monkeypatch.setenv("SCRAPE_RESUME_MAX_AGE_H", bad)
        with pytest.raises(SettingsError, match=rf"SCRAPE_RESUME_MAX_AGE_H='{bad}' is invalid: "
                                                r"expected a number ≥ 0.01 and ≤ 8760"):
            build_resources()
    monkeypatch.setenv("SCRAPE_REQUESTS_PER_SECOND", "nan")  # every number setting: finite only
    monkeypatch.setenv("SCRAPE_RESUME_MAX_AGE_H", "48")
    with pytest.raises(SettingsError, match=r"SCRAPE_REQUESTS_PER_SECOND='nan' is invalid: expected a number"):
        build_resources()


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("SCRAPE_REQUESTS_PER_SECOND", "1e9", "a number ≥ 0.001 and ≤ 100000"),  # the spec's bounds
        ("SCRAPE_MAX_CONCURRENCY", "100000", "an integer ≥ 1 and ≤ 256"),
        ("SCRAPE_MAX_ATTEMPTS", "1000", "an integer ≥ 1 and ≤ 100"),
        ("SCRAPE_LOCK_WAIT_S", "1e7", "a number ≥ 0 and ≤ 86400"),
        ("SCRAPE_USER_AGENT", "shop-bot (jörg.müller@example.de)",
         "printable ASCII text, not blank, at most 512 characters (RFC 9110 §10.1.5: product tokens and comments, "
         "e.g. 'acme-prices/1.0 (+mailto:ops@example.com)'; HTTP clients send no other characters: write 'ö' as "
         "'oe'); this one: character 'ö' (U+00F6) is not printable ASCII"),
        ("SCRAPE_USER_AGENT", "bot\r\nX-Injected: 1", "this one: character '\\r' (U+000D) is not printable ASCII"),
        ("SCRAPE_USER_AGENT", "   ", "this one: blank"),
        ("SCRAPE_USER_AGENT", "b" * 513, "this one: 513 characters"),
    ],
)
def test_a_setting_out_of_range_or_unsendable_stops_at_start_up(monkeypatch, name, value, expected):
    """Before any run: a User-Agent httpx cannot send failed the run's first request (a snapshot
    left with it in its fetch config, refusing the fixed value's resume); limits the spec
    refuses were taken from the environment."""
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as refused:
        build_resources()
    assert str(refused.value).startswith(f"{name}={value!r} is invalid: expected ")
    assert str(refused.value).endswith(expected)
    monkeypatch.setenv(name, "acme-prices/1.0 (+mailto:ops@example.com)" if name == "SCRAPE_USER_AGENT" else "100")
    build_resources()


@pytest.mark.parametrize(
    ("resource", "field", "value", "expected"),
    [
        ("site", "requests_per_second", 1e9, "less than or equal to 100000"),
        ("site", "requests_per_second", 0, "greater than 0"),  # not taken as "unset" (the spec's rate)
        ("site", "max_concurrency", 0, "greater than or equal to 1"),
        ("site", "max_concurrency", 100_000, "less than or equal to 256"),
        ("site", "max_attempts", 1000, "less than or equal to 100"),
        ("site", "user_agent", "shop-bot (jörg@example.de)", "character 'ö' (U+00F6) is not printable ASCII"),
        ("site", "base_url", "ftp://mirror.example/", "expected an absolute http(s) URL with a host"),
        ("site", "base_url", "http://u:SECRET@mirror.example/", "expected a URL without user:password@"),
        ("site", "base_url", "http://mirror.example/?token=SECRET", "expected a URL without a query or fragment"),
        ("store", "lock_wait_s", 1e7, "less than or equal to 86400"),
    ],
)
def test_the_launchpad_has_the_bounds_of_the_settings(resource, field, value, expected):
    """The resources' fields (set in the launchpad) refuse what the SCRAPE_* variables refuse,
    before a run starts (a bad User-Agent failed raw_pages three times, then every resume)."""
    import pydantic

    cls, base = (SiteResource, {}) if resource == "site" else (ObjectStoreResource, {"url": "x"})
    with pytest.raises(pydantic.ValidationError) as refused:
        cls(**base, **{field: value})
    assert field in str(refused.value) and expected in str(refused.value)
    if resource == "site":  # a refused value is not echoed: a base_url's user info may be a password
        assert "SECRET" not in str(refused.value) and "input_value" not in str(refused.value)


@pytest.mark.parametrize(
    ("field", "good", "bad", "expected"),
    [
        ("base_url", "http://mirror.example/", "ftp://mirror.example/", "expected an absolute http(s) URL with a host"),
        ("user_agent", "acme-prices/1.0 (+mailto:ops@example.com)", "shop-bot (jörg@example.de)",
         "is not printable ASCII"),
    ],
)
def test_an_env_var_field_is_checked_for_its_value_when_a_run_starts(monkeypatch, field, good, bad, expected):
    """``SiteResource(base_url=dg.EnvVar("MIRROR"))`` is Dagster's way to read a value at run
    time: the definition is not refused for the variable's name, the run for a bad value."""

    @dg.asset
    def probe(site: SiteResource) -> str:
        return getattr(site, field)

    site = SiteResource(**{field: dg.EnvVar("SCRAPE_TEST_SITE_VALUE")})  # the name alone is no URL: accepted
    monkeypatch.setenv("SCRAPE_TEST_SITE_VALUE", good)
    result = dg.materialize([probe], resources={"site": site}, instance=dg.DagsterInstance.ephemeral())
    assert result.output_for_node("probe") == good
    monkeypatch.setenv("SCRAPE_TEST_SITE_VALUE", bad)
    result = dg.materialize([probe], resources={"site": site}, instance=dg.DagsterInstance.ephemeral(),
                            raise_on_error=False)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type_value == "RESOURCE_INIT_FAILURE"]
    assert expected in failure.event_specific_data.error.message
    assert bad not in failure.event_specific_data.error.message  # not echoed, as in the launchpad


def test_an_empty_base_url_in_the_launchpad_is_the_specs():
    assert SiteResource(base_url="").fetch_base_url() == SiteResource().fetch_base_url() == "http://demo.scrape-assets.invalid/"


def test_resume_max_age_from_run_config_has_the_settings_bounds(tmp_path):
    """The launchpad cannot set 0 (a step retry would then start a new snapshot) or more than a year."""
    from scrape_assets.defs.assets.raw_pages import raw_pages

    def run(hours):
        return dg.materialize(
            [raw_pages], partition_key="travel", raise_on_error=False, instance=dg.DagsterInstance.ephemeral(),
            resources={"site": SiteResource(), "store": ObjectStoreResource.configure_at_launch(),
                       "warehouse": WarehouseResource(url=f"sqlite:///{tmp_path / 'w.db'}")},
            run_config={"resources": {"store": {"config": {"url": str(tmp_path / "o"), "resume_max_age_h": hours}}}},
        )

    def errors(result):
        failures = [e.event_specific_data.error for e in result.all_events if e.is_failure and e.event_specific_data]
        return " ".join(f"{err.to_string()} {err.cause.to_string() if err.cause else ''}" for err in failures if err)

    for bad, expected in ((0, "greater than or equal to 0.01"), (9000, "less than or equal to 8760")):
        result = run(bad)
        assert not result.success
        assert "resume_max_age_h" in errors(result) and expected in errors(result)
    assert run(None).success
    assert ObjectStoreResource(url="x", resume_max_age_h=0.01).resume_max_age().total_seconds() == 36
    assert ObjectStoreResource(url="x", resume_max_age_h=8760).resume_max_age().days == 365


def test_the_commands_own_resources_hold_the_values_not_env_vars(monkeypatch, tmp_path):
    """``scrape-assets`` uses resources itself (preflight, summary, prune): no run resolves an EnvVar there."""
    monkeypatch.setenv("SCRAPE_WAREHOUSE_URL", f"sqlite:///{tmp_path / 'w.db'}")
    monkeypatch.setenv("SCRAPE_STORAGE_URL", str(tmp_path / "objects"))
    monkeypatch.setenv("SCRAPE_PROXY_URL", "http://egress.corp:3128")
    monkeypatch.setenv("SCRAPE_ALERT_WEBHOOK_URL", "https://hooks.example/T0")
    plain = build_resources(secrets_as_env_vars=False)
    assert plain["warehouse"].url == f"sqlite:///{tmp_path / 'w.db'}" and not isinstance(plain["warehouse"].url, dg.EnvVar)
    assert plain["store"].url == str(tmp_path / "objects") and not isinstance(plain["store"].url, dg.EnvVar)
    assert plain["site"].proxy_url == "http://egress.corp:3128" and plain["alerts"].webhook_url == "https://hooks.example/T0"
    with plain["warehouse"].warehouse() as wh:
        assert wh.count(products) == 0  # opens the named database, not one called "SCRAPE_WAREHOUSE_URL"
    assert (tmp_path / "w.db").exists()


def test_loading_the_definitions_imports_neither_the_http_stack_nor_pandas():
    # Sensors, the UI's code server and re-parse backfills load the definitions and never
    # fetch: httpx and aiohttp (~0.1-0.2 s) are imported by raw_pages's step, pandas and
    # pandera by the parse, ftfy by the first page that needs it. A fresh interpreter shows it.
    code = (
        "import sys\n"
        "from scrape_assets.definitions import defs\n"
        "assert defs.resolve_asset_graph().get_all_asset_keys()\n"
        "print(' '.join(m for m in ('httpx', 'aiohttp', 'ftfy', 'pandas', 'pandera') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""
    # and the step still gets its client and policy (imported on first use)
    site = SiteResource(max_concurrency=3)
    assert site.fetch_policy().max_concurrency == 3
    client = site.client()
    assert type(client).__name__ == "AsyncClient"
    asyncio.run(client.aclose())


def test_a_misspelled_setting_is_warned_about_once_with_the_closest_name(caplog, monkeypatch):
    import logging

    from scrape_assets import settings

    monkeypatch.setattr(settings, "_warned", set())
    env = {"SCRAPE_DATADIR": "/tmp/x", "SCRAPE_MAX_CONCURENCY": "4", "SCRAPE_FROBNICATE": "1",
           "SCRAPE_TEST_PIDS_FILE": "/tmp/pids", "SCRAPE_SITE": "demo"}
    with caplog.at_level(logging.WARNING, logger="scrape_assets.settings"):
        loaded = settings.load_settings(env)
        settings.load_settings(env)  # once per name and process
    assert loaded.data_dir != "/tmp/x"  # ignored, as the warning says
    assert [r.getMessage() for r in caplog.records] == [
        "SCRAPE_DATADIR is not a setting of scrape_assets: ignored (did you mean SCRAPE_DATA_DIR?)",
        "SCRAPE_FROBNICATE is not a setting of scrape_assets: ignored (the settings: README, Configuration)",
        "SCRAPE_MAX_CONCURENCY is not a setting of scrape_assets: ignored (did you mean SCRAPE_MAX_CONCURRENCY?)",
    ]


def test_a_spec_file_that_cannot_be_read_names_the_setting_that_named_it(tmp_path):
    from scrape_assets import settings
    from scrape_assets.errors import SpecError

    missing = tmp_path / "nope.yaml"
    with pytest.raises(SettingsError) as info:
        settings.load_settings({"SCRAPE_SITE": str(missing)})
    assert str(info.value) == (f"SCRAPE_SITE={str(missing)!r} is invalid: expected a readable spec file; "
                               f"{missing}: cannot read spec file: No such file or directory")
    bad_key = tmp_path / "bad.yaml"
    bad_key.write_text("name: demo\nbase_url: [\n")
    with pytest.raises(SpecError) as info:  # readable but not a spec: the file (and key) named, as before
        settings.load_settings({"SCRAPE_SITE": str(bad_key)})
    assert not isinstance(info.value, SettingsError) and str(info.value).startswith(f"{bad_key}: ")


def test_every_scrape_variable_the_package_reads_is_a_known_setting():
    """A new setting must join KNOWN_VARIABLES, or setting it would be warned about as a misspelling."""
    import re
    from pathlib import Path

    from scrape_assets import settings

    source = Path(settings.__file__).parent
    names = {m for path in source.rglob("*.py") for m in re.findall(r"\bSCRAPE_[A-Z0-9_]+\b", path.read_text())}
    names = {n for n in names if not n.endswith("_")} - {"SCRAPE_ASSETS"}  # not prefixes, nor the Python name in defs/jobs.py
    assert names <= settings.KNOWN_VARIABLES, names - settings.KNOWN_VARIABLES
    assert "SCRAPE_DATA_DIR" in names and "SCRAPE_CRASHPOINT" in names  # the scan found them


def test_storage_urls_the_settings_accept_and_refuse():
    from scrape_assets.settings import storage_url_problem

    for fine in ("/srv/scrape/objects", "~/objects", "s3://bucket/prefix", "file:///srv/objects",
                 "simplecache::s3://bucket/p", "s3:/bucket"):  # the last: the store names its missing bucket
        assert storage_url_problem(fine) is None, fine
    assert storage_url_problem("gs//bucket/p").startswith("an object store URL with '://' after its protocol, "
                                                          "e.g. gs://bucket/p")
    assert storage_url_problem("./objects").startswith("an absolute folder (this one is ")
    for relative in ("s3:bucket/x", "C:/data", "file:relative"):  # fsspec reads each as a relative folder
        assert storage_url_problem(relative).startswith("an absolute folder"), relative
    for relative in ("file://data/objects", "local://data/objects"):  # "data" is no host: a relative folder
        assert storage_url_problem(relative).startswith(f"a {relative.split(':')[0]}:// URL of an absolute folder")
    assert storage_url_problem("local:///srv/objects") is None
    for query in ("s3://bucket/prefix?region=eu", "file:///srv/objects#x", "file:/srv/objects?t=1",
                  "simplecache::s3://bucket/p?x=1"):  # fsspec would make it part of the names
        assert storage_url_problem(query).startswith("a storage URL with no query or fragment"), query
    assert storage_url_problem("/srv/objects?x") is None  # a plain path names a folder as it is


def test_a_storage_url_with_a_query_is_refused_showing_where_the_query_was():
    from scrape_assets.errors import SettingsError
    from scrape_assets.settings import load_settings

    with pytest.raises(SettingsError) as info:
        load_settings({"SCRAPE_STORAGE_URL": "s3://bucket/prefix?region=eu-s3cret"})
    assert str(info.value).startswith("SCRAPE_STORAGE_URL='s3://bucket/prefix?<hidden>' is invalid: expected a "
                                      "storage URL with no query or fragment")
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize("day", ["20261201", "2026-W48-1", "2026-12-1", "2026-13-01"])
def test_a_demo_date_is_only_yyyy_mm_dd(day):
    """date.fromisoformat reads 20261201 and 2026-W48-1 too; the demo catalogue does not."""
    from scrape_assets.errors import SettingsError
    from scrape_assets.settings import load_settings

    with pytest.raises(SettingsError, match="expected a date as YYYY-MM-DD"):
        load_settings({"SCRAPE_DEMO_DATE": day})
    load_settings({"SCRAPE_DEMO_DATE": " 2026-12-01 "})  # as the demo catalogue reads it (stripped)


def test_a_storage_folder_under_home_is_the_users_home(monkeypatch, tmp_path):
    from scrape_assets.storage import ObjectStore

    monkeypatch.setenv("HOME", str(tmp_path))
    store = ObjectStore("~/objects")
    store.write_bytes_atomic("demo/x.txt", b"x")
    assert (tmp_path / "objects" / "demo" / "x.txt").read_bytes() == b"x"  # not ./~/objects



def test_a_setting_typed_with_a_word_missing_gets_the_closest_name():
    from scrape_assets.settings import unknown_variables

    assert unknown_variables({"SCRAPE_WEBHOOK_URL": "x", "SCRAPE_LOCK_WAIT": "5", "SCRAPE_TEST_X": "1"}) == [
        ("SCRAPE_LOCK_WAIT", "SCRAPE_LOCK_WAIT_S"), ("SCRAPE_WEBHOOK_URL", "SCRAPE_ALERT_WEBHOOK_URL")]


def test_the_settings_defaults(monkeypatch, tmp_path):
    """Every setting unset: the defaults of the table in scrape_assets/settings.py, paths absolute."""
    from scrape_assets.settings import load_settings

    monkeypatch.chdir(tmp_path)
    settings = load_settings({})
    assert (settings.site, settings.base_url, settings.max_attempts, settings.schedule_cron, settings.lock_wait_s,
            settings.resume_max_age_h, settings.requests_per_second, settings.max_concurrency) == (
        "demo", None, 3, "0 2 * * *", 0.0, 20.0, None, None)
    assert settings.data_dir == str(tmp_path / "data")  # ./data of this process's folder, made absolute
    assert settings.storage_url == str(tmp_path / "data" / "objects")
    assert settings.warehouse_url == f"sqlite:///{tmp_path / 'data' / 'warehouse.db'}"
    assert not (settings.alert_webhook_set or settings.proxy_set or settings.storage_url_set or settings.warehouse_url_set)


def test_a_data_dir_under_home_is_the_users_home(monkeypatch, tmp_path):
    from scrape_assets.settings import load_settings

    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_settings({"SCRAPE_DATA_DIR": "~/scrape"}).data_dir == str(tmp_path / "scrape")


def test_number_settings_take_their_bounds_and_an_empty_value_is_unset():
    """Each bound is allowed (≥, ≤); a variable set to "" (``KEY=`` in a .env file) is its default."""
    from scrape_assets.settings import load_settings

    lowest = load_settings({"SCRAPE_MAX_ATTEMPTS": "1", "SCRAPE_MAX_CONCURRENCY": "1", "SCRAPE_LOCK_WAIT_S": "0",
                            "SCRAPE_RESUME_MAX_AGE_H": "0.01", "SCRAPE_REQUESTS_PER_SECOND": "0.001"})
    assert (lowest.max_attempts, lowest.max_concurrency, lowest.lock_wait_s, lowest.resume_max_age_h,
            lowest.requests_per_second) == (1, 1, 0.0, 0.01, 0.001)
    highest = load_settings({"SCRAPE_MAX_ATTEMPTS": "100", "SCRAPE_MAX_CONCURRENCY": "256",
                             "SCRAPE_LOCK_WAIT_S": "86400", "SCRAPE_RESUME_MAX_AGE_H": "8760",
                             "SCRAPE_REQUESTS_PER_SECOND": "100000"})
    assert (highest.max_attempts, highest.max_concurrency, highest.lock_wait_s, highest.resume_max_age_h,
            highest.requests_per_second) == (100, 256, 86400.0, 8760.0, 100000.0)
    empty = load_settings({name: "" for name in ("SCRAPE_MAX_ATTEMPTS", "SCRAPE_MAX_CONCURRENCY", "SCRAPE_LOCK_WAIT_S",
                                                 "SCRAPE_RESUME_MAX_AGE_H", "SCRAPE_REQUESTS_PER_SECOND")})
    assert (empty.max_attempts, empty.max_concurrency, empty.lock_wait_s, empty.resume_max_age_h,
            empty.requests_per_second) == (3, None, 0.0, 20.0, None)
    for name, value, expected in (("SCRAPE_MAX_CONCURRENCY", "0", "an integer ≥ 1 and ≤ 256"),
                                  ("SCRAPE_REQUESTS_PER_SECOND", "0", "a number ≥ 0.001 and ≤ 100000"),
                                  ("SCRAPE_LOCK_WAIT_S", "-1", "a number ≥ 0 and ≤ 86400"),
                                  ("SCRAPE_MAX_ATTEMPTS", "0", "an integer ≥ 1 and ≤ 100")):
        with pytest.raises(SettingsError) as refused:
            load_settings({name: value})
        assert str(refused.value) == f"{name}={value!r} is invalid: expected {expected}"


def test_webhook_urls_the_settings_accept_and_refuse():
    from scrape_assets.settings import load_settings

    assert load_settings({"SCRAPE_ALERT_WEBHOOK_URL": "http://alerts.internal:8080/hook"}).alert_webhook_set
    for bad in ("https://", "https://hooks.example/T0/a secret", "https://hooks.example:port/secret"):
        with pytest.raises(SettingsError) as refused:
            load_settings({"SCRAPE_ALERT_WEBHOOK_URL": bad})
        assert str(refused.value).startswith("SCRAPE_ALERT_WEBHOOK_URL='<hidden>' is invalid: expected an http(s) URL "
                                              "with a host"), bad
        assert "secret" not in str(refused.value)


def test_a_refused_url_setting_never_echoes_a_secret():
    """A base URL's fragment, or a storage URL's user info, may hold a token: not echoed."""
    from scrape_assets.settings import load_settings

    with pytest.raises(SettingsError) as refused:
        load_settings({"SCRAPE_BASE_URL": "http://mirror.example/#token=secret"})
    assert str(refused.value).startswith("SCRAPE_BASE_URL='<hidden>' is invalid: expected a URL without a query")
    for url, shown in (("file://u:secret@data/objects", "file://data/objects"),
                       ("memory://u:secret@x/objects", "memory://x/objects"),
                       ("MEMORY://objects", "memory://objects")):  # the scheme in any case
        with pytest.raises(SettingsError) as refused:
            load_settings({"SCRAPE_STORAGE_URL": url})
        assert str(refused.value).startswith(f"SCRAPE_STORAGE_URL={shown!r} is invalid: expected a"), url


def test_a_schedule_cron_has_exactly_five_fields():
    from scrape_assets.settings import load_settings

    for bad in ("0 2 * * * *", "0 2 * *"):  # a seconds or years field (Quartz style), a field missing
        with pytest.raises(SettingsError, match=r"expected a cron expression with 5 fields"):
            load_settings({"SCRAPE_SCHEDULE_CRON": bad})
    assert load_settings({"SCRAPE_SCHEDULE_CRON": "30 4 * * 1-5"}).schedule_cron == "30 4 * * 1-5"
    # checked stripped, kept stripped: a \r left by a CRLF .env file does not reach the schedule
    assert load_settings({"SCRAPE_SCHEDULE_CRON": " 30 4 * * 1-5\r"}).schedule_cron == "30 4 * * 1-5"


def test_file_in_the_way_names_the_file_blocking_a_folder(tmp_path):
    from scrape_assets.settings import file_in_the_way

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert file_in_the_way(blocker) == blocker
    assert file_in_the_way(blocker / "data" / "objects") == blocker
    assert file_in_the_way(tmp_path / "new" / "data") is None


@pytest.mark.parametrize(("url", "expected"), [
    ("data/objects", "data/objects: cannot open object storage: expected an absolute folder (this one is "),
    ("s3//bucket/prefix", "s3//bucket/prefix: cannot open object storage: expected an object store URL with '://' "
                          "after its protocol, e.g. s3://bucket/prefix"),
    ("s3://bucket/prefix?region=S3CRET", "s3://bucket/prefix?<hidden>: cannot open object storage: expected a "
                                         "storage URL with no query or fragment"),
])
def test_a_storage_url_given_in_the_launchpad_is_checked_as_the_variable_is(tmp_path, monkeypatch, url, expected):
    """SCRAPE_STORAGE_URL refused a relative folder and "s3//"; the store resource's url set in
    the launchpad went to fsspec as it was: pages written under the run worker's own folder."""
    from scrape_assets.defs.resources import ObjectStoreResource
    from scrape_assets.errors import StorageError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageError) as info:
        ObjectStoreResource(url=url).store()
    assert str(info.value).startswith(expected) and "S3CRET" not in str(info.value)
    assert list(tmp_path.iterdir()) == []
