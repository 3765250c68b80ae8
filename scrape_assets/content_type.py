"""The ``charset`` parameter of a ``Content-Type`` header value (RFC 9110 §8.3.2).

One reading shared by the parser (which decodes by it) and the manifest (whose data
version counts it), so both agree on what a label says. No dependency beyond ``re``.
"""

from __future__ import annotations

import re

#: a parameter named charset: at the start of the value or after a ";" (or a "," where two
#: header lines were joined), never a name ending in "charset" or text inside another's value
_HEADER_CHARSET = re.compile(r"""(?:^|[;,])\s*charset\s*=\s*["']?\s*([^"';,\s]+)""", re.IGNORECASE)


def header_charset(content_type: str | None) -> str | None:
    """The charset label ``content_type`` declares, as written (``"text/html; charset=UTF-8"``
    -> ``"UTF-8"``); None when it declares none."""
    match = _HEADER_CHARSET.search(content_type) if content_type else None
    return match.group(1) if match else None
