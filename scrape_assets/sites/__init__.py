"""Shipped site specs (YAML): ``demo`` and ``books_toscrape``; see :mod:`scrape_assets.spec`."""
