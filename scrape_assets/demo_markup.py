"""HTML and text templates of the demo catalogue (see :mod:`scrape_assets.demo_site`).

The markup copies the shape of books.toscrape.com listing pages (Django Oscar templates):
the same element names, classes, nesting, relative links and generous whitespace, so a
listing page of 20 products weighs about 45 KB like the real one. Nothing here decides
*what* is on a page; :mod:`scrape_assets.demo_site` passes the data in.
"""

from __future__ import annotations

import hashlib
import html
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrape_assets.demo_site import DemoCatalogue, DemoCategory, DemoProduct

#: The rules of the demo's robots.txt (RFC 9309); they never cover ``/catalogue/``.
ROBOTS_RULES = """\
# robots.txt of the scrape-assets demo catalogue (RFC 9309)
User-agent: *
Disallow: /basket/
Disallow: /accounts/
Allow: /catalogue/
"""
#: The demo's robots.txt: :data:`ROBOTS_RULES` and a ``Sitemap:`` line naming the sitemap on
#: the site's canonical origin, as a real site names it (a mirror serves it too).
ROBOTS_TXT = ROBOTS_RULES + "\nSitemap: http://demo.scrape-assets.invalid/sitemap.xml\n"

_WARNING = (
    '<div class="alert alert-warning" role="alert"><strong>Warning!</strong> This is a demo website '
    "for web scraping purposes. Prices and ratings here were generated from a fixed seed and have no "
    "real meaning.</div>"
)


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def truncate_words(title: str, words: int = 4) -> str:
    """Shorten ``title`` to its first ``words`` words plus ``" ..."``, like Django's ``truncatewords``."""
    parts = title.split()
    return title if len(parts) <= words else " ".join(parts[:words]) + " ..."


def _layout(*, title: str, root: str, breadcrumb: str, sidebar: str, main: str) -> str:
    """The page chrome: head, header, breadcrumb, sidebar, content column, footer, scripts."""
    return f"""

<!DOCTYPE html>
<!--[if lt IE 7]>      <html lang="en-us" class="no-js lt-ie9 lt-ie8 lt-ie7"> <![endif]-->
<!--[if IE 7]>         <html lang="en-us" class="no-js lt-ie9 lt-ie8"> <![endif]-->
<!--[if IE 8]>         <html lang="en-us" class="no-js lt-ie9"> <![endif]-->
<!--[if gt IE 8]><!--> <html lang="en-us" class="no-js"> <!--<![endif]-->
    <head>
        <meta charset="utf-8">
        <title>
    {_esc(title)} |
     Demo Catalogue - scrape-assets

</title>
        <meta name="description" content="A deterministic demo catalogue for scrape-assets." />
        <meta name="viewport" content="width=device-width" />
        <meta name="robots" content="NOARCHIVE,NOCACHE" />

            <link rel="shortcut icon" href="{root}static/oscar/favicon.ico" />

        <link rel="stylesheet" type="text/css" href="{root}static/oscar/css/styles.css" />
    <link rel="stylesheet" href="{root}static/oscar/js/bootstrap-datetimepicker/bootstrap-datetimepicker.css" />
    <link rel="stylesheet" type="text/css" href="{root}static/oscar/css/datetimepicker.css" />
    </head>

    <body id="default" class="default">

    <header class="header container-fluid">
        <div class="page_inner">
            <div class="row">
                <div class="col-sm-8 h1"><a href="{root}index.html">Demo Catalogue</a><small> Scrape me, deterministically!</small>
</div>

                <div class="basket-mini pull-right hidden-xs">
                    <a href="{root}basket/" class="btn btn-default">View basket</a>
                    <a href="{root}accounts/login/" class="btn btn-link">Login or register</a>
                </div>
            </div>
        </div>
    </header>

    <div class="navbar primary navbar-static-top navbar-inverse">
        <div class="container-fluid">
            <div class="navbar-header pull-right">
                <a class="btn btn-navbar" data-toggle="collapse" data-target=".primary-collapse">
                    <span class="icon-bar"></span>
                    <span class="icon-bar"></span>
                    <span class="icon-bar"></span>
                </a>
            </div>
            <div class="navbar-collapse primary-collapse collapse">
                <ul id="browse" class="nav navbar-nav">
                    <li class="dropdown active">
                        <a href="#" class="dropdown-toggle" data-toggle="dropdown">Browse store<b class="caret"></b></a>
                        <ul class="dropdown-menu" data-navigation="dropdown-menu">
                            <li><a href="{root}index.html" tabindex="-1">All categories</a></li>
                        </ul>
                    </li>
                </ul>
                <form method="get" action="{root}search/" class="navbar-form navbar-right">
                    <div class="form-group">
                        <label for="id_q" class="sr-only">Search</label>
                        <input id="id_q" name="q" placeholder="Search the demo catalogue" type="search" class="form-control" />
                    </div>
                    <input type="submit" value="Search" class="btn btn-default" />
                </form>
            </div>
        </div>
    </div>

<div class="container-fluid page">
    <div class="page_inner">

    <ul class="breadcrumb">
        <li>
            <a href="{root}index.html">Home</a>
        </li>
        {breadcrumb}
    </ul>

        <div class="row">

            <aside class="sidebar col-sm-4 col-md-3">

                <div id="promotions_left">

                </div>
{sidebar}
            </aside>

            <div class="col-sm-8 col-md-9">
{main}
            </div>

        </div><!-- /row -->
    </div><!-- /page_inner -->
</div><!-- /container-fluid -->

<footer class="footer container-fluid">
    <div class="page_inner">
        <div class="row">
            <div class="col-sm-6">
                <p>This catalogue is generated from a fixed seed by scrape-assets. Titles, ratings and
                categories never change; prices change once a day (midnight UTC). The markup follows
                the shape of books.toscrape.com so the same selectors work on both sites.</p>
            </div>
            <div class="col-sm-6">
                <ul class="list-unstyled">
                    <li><a href="{root}index.html">All categories</a></li>
                    <li><a href="{root}robots.txt">robots.txt</a></li>
                </ul>
            </div>
        </div>
    </div>
</footer>

            <!-- jQuery -->
            <script src="{root}static/oscar/js/jquery/jquery-1.9.1.min.js"></script>

    <!-- Twitter Bootstrap -->
    <script type="text/javascript" src="{root}static/oscar/js/bootstrap3/bootstrap.min.js"></script>
    <!-- Oscar -->
    <script src="{root}static/oscar/js/oscar/ui.js" type="text/javascript" charset="utf-8"></script>

        <script type="text/javascript">
            $(function() {{
    oscar.init();

    oscar.search.init();

            }});
        </script>

        <!-- Version: scrape-assets demo -->

    </body>
</html>
"""


def _sidebar(catalogue: DemoCatalogue, *, link_prefix: str, home: str, current: str | None) -> str:
    items = []
    for category in sorted(catalogue.categories, key=lambda c: c.number):
        href = "index.html" if category.key == current else f"{link_prefix}{category.folder}/index.html"
        label = f"<strong>{_esc(category.name)}</strong>" if category.key == current else _esc(category.name)
        items.append(f"""
                    <li>
                        <a href="{href}">

                                {label}

                        </a>

                        </li>
""")
    return f"""
        <div class="side_categories">
            <ul class="nav nav-list">

                    <li>
                        <a href="{home}">

                                Books

                        </a>

                        <ul>
{"".join(items)}
                            </ul></li>

            </ul>
        </div>
"""


def _product_card(product: DemoProduct, *, prefix: str, root: str) -> str:
    href = f"{prefix}{product.slug}_{product.id}/index.html"
    image = hashlib.md5(f"demo-cover-{product.id}".encode()).hexdigest()  # noqa: S324 (not security)
    title = _esc(product.title)
    return f"""
                        <li class="col-xs-6 col-sm-4 col-md-3 col-lg-3">






    <article class="product_pod">
        
            <div class="image_container">
                
                    
                    <a href="{href}"><img src="{root}media/cache/{image[:2]}/{image[2:4]}/{image}.jpg" alt="{title}" class="thumbnail"></a>
                    
                
            </div>
        

        
            
                <p class="star-rating {product.rating_word}">
                    <i class="icon-star"></i>
                    <i class="icon-star"></i>
                    <i class="icon-star"></i>
                    <i class="icon-star"></i>
                    <i class="icon-star"></i>
                </p>
            
        

        
            <h3><a href="{href}" title="{title}">{_esc(truncate_words(product.title))}</a></h3>
        

        
            <div class="product_price">
                






    
        <p class="price_color">£{product.price:.2f}</p>
    

<p class="instock availability">
    <i class="icon-ok"></i>
    
        {product.availability}
    
</p>

                
                    






    
    <form>
        <button type="submit" class="btn btn-primary btn-block" data-loading-text="Adding...">Add to basket</button>
    </form>


                
            </div>
        
    </article>

</li>
                    """


def _pager(page: int, page_count: int) -> str:
    if page_count <= 1:
        return ""
    previous = following = ""
    if page > 1:
        previous = f'\n                <li class="previous"><a href="page-{page - 1}.html">previous</a></li>\n'
    if page < page_count:
        following = f'\n                <li class="next"><a href="page-{page + 1}.html">next</a></li>\n'
    return f"""
    <div>
        <ul class="pager">
            {previous}
            <li class="current">

                Page {page} of {page_count}

            </li>
            {following}
        </ul>
    </div>
"""


def listing_page(catalogue: DemoCatalogue, category: DemoCategory, page: int) -> str:
    """One listing page of ``category`` (1-based ``page``), as books.toscrape.com renders it.

    Raises:
        ValueError: ``page`` is outside ``1..category.page_count``.
    """
    products = category.page_products(page)
    total = len(category.products)
    if category.page_count > 1:
        first = (page - 1) * category.page_size + 1
        last = first + len(products) - 1
        count = f"<strong>{total}</strong> results - showing <strong>{first}</strong> to <strong>{last}</strong>."
    else:
        count = f"<strong>{total}</strong> results."
    root, prefix = "../../../../", "../../../"
    cards = "".join(_product_card(p, prefix=prefix, root=root) for p in products)
    main = f"""
                <div class="page-header action">
                    <h1>{_esc(category.name)}</h1>
                </div>

<div id="messages">

</div>

                <div id="promotions">

                </div>

    <form method="get" class="form-horizontal">

        <div style="display:none">

        </div>

                    {count}

    </form>

        <section>
            {_WARNING}

            <div>
                <ol class="row">
{cards}
                </ol>
{_pager(page, category.page_count)}
            </div>
        </section>
"""
    breadcrumb = f"""
        <li class="active">{_esc(category.name)}</li>"""
    sidebar = _sidebar(catalogue, link_prefix="../", home=f"{root}index.html", current=category.key)
    return _layout(title=category.name, root=root, breadcrumb=breadcrumb, sidebar=sidebar, main=main)


def home_page(catalogue: DemoCatalogue) -> str:
    """The home page: every category with its product count, linked from the site root."""
    rows = "".join(
        f'\n                    <li><a href="{c.path}">{_esc(c.name)}</a> ({len(c.products)} products)</li>'
        for c in catalogue.categories
    )
    main = f"""
                <div class="page-header action">
                    <h1>All categories</h1>
                </div>

        <section>
            {_WARNING}

            <div>
                <ul class="categories">{rows}
                </ul>
            </div>
        </section>
"""
    sidebar = _sidebar(catalogue, link_prefix="catalogue/category/books/", home="index.html", current=None)
    return _layout(title="All categories", root="", breadcrumb="", sidebar=sidebar, main=main)


def error_page(status: str, message: str) -> str:
    """A small HTML error page: ``status`` such as ``"404 Not Found"``, ``message`` escaped here."""
    return (
        f'<!DOCTYPE html>\n<html lang="en-us"><head><meta charset="utf-8"><title>{_esc(status)}</title></head>\n'
        f"<body><h1>{_esc(status)}</h1><p>{_esc(message)}</p></body></html>\n"
    )
