"""Forward-proxy URLs (``SCRAPE_PROXY_URL``): parsed once, credentials kept apart from the address.

The address (``http://host:port``) is what aiohttp connects to and what logs may show; the
credentials only ever travel as a ``Proxy-Authorization: Basic`` header (RFC 9110,
section 11.7.1, with RFC 7617's Basic scheme), so no error message, log line or dead
letter can carry them. A malformed value is refused without echoing it (it may hold a
password).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from urllib.parse import unquote

#: What a valid value looks like, for error messages.
EXPECTED = "an http://[user:pass@]host:port proxy URL, e.g. http://user:pass@proxy.internal:3128"


@dataclass(frozen=True)
class ProxyURL:
    """An ``http://`` forward proxy.

    Attributes:
        host: host name, IPv4 address or bracketed IPv6 address (``[::1]``).
        port: TCP port, 1..65535 (required: no default is assumed).
        username, password: percent-decoded credentials, or None (not shown by ``repr``).
    """

    host: str
    port: int
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str) -> ProxyURL:
        """Parse ``http://[user[:password]@]host:port[/]``.

        The credentials end at the last ``@``, so a password may hold ``/ ? # @`` unencoded;
        percent-encoded ones (``%40``) are decoded.

        Raises:
            ValueError: anything else (another scheme, no port, a path or query); the
                message never contains ``url``.
        """
        if not url.startswith("http://"):
            raise ValueError(f"expected {EXPECTED}")
        userinfo, at, hostport = url[len("http://"):].rpartition("@")
        hostport = hostport.removesuffix("/")
        host, colon, port = hostport.rpartition(":")
        bracketed_ipv6 = host.startswith("[") and host.endswith("]") and ":" in host
        valid_host = bracketed_ipv6 or (bool(host) and not any(c in host for c in "/?#[]: "))
        if not (colon and valid_host and port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"expected {EXPECTED}")
        if not at:
            return cls(host, int(port))
        username, _, password = userinfo.partition(":")
        return cls(host, int(port), unquote(username), unquote(password))

    @property
    def address(self) -> str:
        """``http://host:port``: what to connect to, and what logs may show."""
        return f"http://{self.host}:{self.port}"

    @property
    def authorization(self) -> str | None:
        """The ``Proxy-Authorization`` header value (``Basic <base64 of user:password>``), or None."""
        if self.username is None:
            return None
        token = f"{self.username}:{self.password or ''}".encode()
        return "Basic " + base64.b64encode(token).decode("ascii")
