"""The assets: raw_pages -> parsed_products -> products_table, and dead_letters."""
