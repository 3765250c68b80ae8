"""Whether a URL's host is a name the fetcher can look up: one check for the spec and the fetcher.

httpx parses ``http://xn--zz.example/`` and ``http://shop..example/`` and fails only later:
reading such a URL's ``host`` raises ``idna.IDNAError``, and aiohttp's name lookup raises a
bare ``UnicodeError`` (``socket.getaddrinfo`` encodes the host with Python's ``idna`` codec,
which refuses an empty label or one over 63 characters). :func:`host_name_problem` says so
up front, the way httpx encodes hosts (IDNA 2008, the ``idna`` package), so that the spec
refuses such a base URL and the fetcher turns such a page or redirect into a dead letter.
"""

from __future__ import annotations

import functools
import ipaddress

#: the ports a URL of these schemes means when it names none
DEFAULT_PORTS = {"http": 80, "https": 443}


def url_host_problem(url) -> str | None:
    """:func:`host_name_problem` of an ``httpx.URL``'s host, read as it was encoded
    (``raw_host``): reading its ``host`` is what raises for an ``xn--`` host that is no IDNA name."""
    return host_name_problem(url.raw_host.decode("ascii"))


@functools.lru_cache(maxsize=1024)
def ascii_host(host: str) -> str:
    """``host`` (lower case) in ASCII as httpx sends it: a Unicode name IDNA 2008-encoded
    (``straße.de`` -> ``xn--strae-oqa.de``; Python's own ``idna`` codec, IDNA 2003, would give
    ``strasse.de``, another host); an ASCII host, or one IDNA 2008 cannot encode, as written."""
    host = host.lower()
    if host.isascii():
        return host
    import idna

    try:
        return _idna_2008(host)
    except idna.IDNAError:  # not a name httpx can fetch: the fetcher refuses it (host_name_problem)
        return host


def _idna_2008(host: str) -> str:
    """A Unicode ``host`` in ASCII as httpx encodes it (the ``idna`` package, IDNA 2008, lower
    case first). Raises ``idna.IDNAError``."""
    import idna  # httpx's own dependency; only for a Unicode host (the definitions do not load it)

    return idna.encode(host.lower()).decode("ascii")


@functools.lru_cache(maxsize=1024)
def host_name_problem(host: str) -> str | None:
    """What keeps ``host`` from being looked up, or None when nothing does.

    Args:
        host: a URL's host as ``urlsplit(url).hostname`` or ``httpx.URL(url).raw_host``
            (decoded) give it: IPv6 without brackets, a name in ASCII (punycode) or Unicode.

    Returns:
        None for an IP address or a name whose labels (RFC 1035 §2.3.4: 1 to 63 characters;
        one trailing dot allowed) are each plain ASCII or a valid IDNA 2008 A-label (RFC 5891,
        as httpx decodes ``xn--`` labels), and whose Unicode form IDNA 2008 can encode
        (``straße.de`` yes, ``i❤.ws`` no, as httpx refuses it). Else the problem in a few
        words, e.g. ``"an empty label"``. Letters, digits and hyphens are not checked further
        (``shop_1.example`` passes): a name that does not exist is the resolver's to say.
    """
    if not host:
        return "no host"
    try:
        ipaddress.ip_address(host.partition("%")[0])  # an IPv6 zone ("%eth0") is not the address's
        return None
    except ValueError:
        pass
    if host.isascii():
        name = host
    else:
        import idna

        try:
            name = _idna_2008(host)
        except idna.IDNAError as exc:
            return f"not an IDNA 2008 name ({exc})"
    labels = name.removesuffix(".").split(".")
    if any(not label for label in labels):
        return "an empty label"
    if any(len(label) > 63 for label in labels):
        return "a label over 63 characters"
    for label in labels:
        if label[:4].lower() == "xn--":
            import idna

            try:
                idna.decode(label)
            except idna.IDNAError as exc:
                return f"{label!r} is no IDNA 2008 label ({exc})"
    if name[:4].lower() == "xn--":  # httpx decodes such a host whole: its other labels must be IDNA 2008 too
        import idna

        try:
            idna.decode(name)
        except idna.IDNAError as exc:
            return f"not an IDNA 2008 name ({exc})"
    return None
