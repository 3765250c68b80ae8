"""scrape_assets: a restartable, observable web scraping pipeline on Dagster."""

__version__ = "0.1.0"
