"""Forward-proxy URLs (``SCRAPE_PROXY_URL``): parsed once, credentials kept apart from the address.

The address (``http://host:port``) is what aiohttp connects to and what logs may show; the
credentials only ever travel as a ``Proxy-Authorization: Basic`` header (RFC 9110,
section 11.7.1, with RFC 7617's Basic scheme), so no error message, log line or dead
letter can carry them. A malformed value is refused without echoing it (it may hold a
password).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from urllib.parse import unquote

from scrape_assets.errors import SettingsError

#: What a valid value looks like, for error messages.
EXPECTED = "an http://[user:pass@]host:port proxy URL, e.g. http://user:pass@proxy.internal:3128"
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")  # a DNS name or an IPv4 address
_IPV6 = re.compile(r"\[[0-9A-Fa-f:.]{2,45}\]")


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
            ValueError: anything else; the message names the rule broken (scheme, host, port,
                or something after the port) but never contains ``url``.
        """
        if not url.startswith("http://"):
            raise ValueError(f"expected {EXPECTED} (the scheme must be http://)")
        userinfo, at, hostport = url[len("http://"):].rpartition("@")
        hostport = hostport.removesuffix("/")
        if any(c in hostport for c in "/?#"):
            raise ValueError(f"expected {EXPECTED} (nothing may follow the port)")
        host, colon, port = hostport.rpartition(":")
        if not (colon and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"expected {EXPECTED} (the port must be given, 1..65535)")
        if not (_HOST.fullmatch(host) or _IPV6.fullmatch(host)):
            raise ValueError(f"expected {EXPECTED} (the host must be a name, an IPv4 or a bracketed IPv6 address)")
        if not at or not userinfo:  # "http://@host:port": no credentials
            return cls(host, int(port))
        username, _, password = userinfo.partition(":")
        return cls(host, int(port), unquote(username), unquote(password))

    @classmethod
    def from_setting(cls, url: str) -> ProxyURL:
        """:meth:`parse` for the value of ``SCRAPE_PROXY_URL`` (environment or resource config).

        Raises:
            SettingsError: naming the variable and the rule broken; the value shows as
                ``<hidden>`` (it may hold a password).
        """
        try:
            return cls.parse(url)
        except ValueError as exc:
            raise SettingsError("SCRAPE_PROXY_URL", "<hidden>", str(exc).removeprefix("expected ")) from None

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
