"""Parse saved listing pages (bytes) into product rows: pure functions, no network, no Dagster.

One listing page becomes a :class:`ParsedPage`: the product rows it holds, the product cards
that could not be read (:class:`Reject`, each with its reason), and what the pager says
(:class:`PagerInfo`). Where things live in the page comes from a
:class:`~scrape_assets.spec.SiteSpec` (CSS selectors as understood by selectolax/lexbor).

Text is decoded by :func:`decode_html` rules (BOM, then the ``Content-Type`` charset, then
``<meta charset>``, else UTF-8; undecodable bytes become U+FFFD) and mojibake is repaired with
ftfy: the saved books.toscrape.com pages are UTF-8 encoded twice, so the pound sign arrives as
``"Â£"``. :func:`parse_listing` repairs each extracted field instead of the whole document
(the structure of a page is ASCII, so the result is the same and parsing is ~20x faster).
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from urllib.parse import urljoin, urlsplit, uses_relative

from selectolax.lexbor import LexborHTMLParser, LexborNode

from scrape_assets.content_type import header_charset
from scrape_assets.currencies import is_price_currency
from scrape_assets.hostnames import DEFAULT_PORTS
from scrape_assets.limits import MAX_PRODUCT_ID_CHARS, PRICE_PRECISION, PRICE_SCALE, price_fits
from scrape_assets.spec import Field_, SiteSpec

# --- decoding -------------------------------------------------------------------------------

_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
#: How far into the body to look for <meta charset> (the WHATWG prescan looks at 1024 bytes;
#: real pages start with blank lines and comments, so allow more). A tag must end within it.
_META_SCAN_BYTES = 4096
_COMMENT = re.compile(rb"<!--.*?-->", re.DOTALL)
_META_TAG = re.compile(rb"<meta[\s/][^>]*>", re.IGNORECASE)
_ATTRIBUTE = re.compile(rb"""([^\s=/>]+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]*)))?""")
_CHARSET_IN_CONTENT = re.compile(rb"""charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
#: Python codec names decoded as windows-1252 with the C1 gaps kept, as the WHATWG Encoding
#: Standard does for these labels: lossless, so ftfy can still undo mojibake afterwards.
_AS_WINDOWS_1252 = {"ascii", "iso8859-1", "latin-1", "cp1252"}
#: Labels a browser decodes with a larger codec than Python's codec of that name (WHATWG
#: Encoding Standard, section 4.2 "Names and labels"): GBK is read by the gb18030 decoder,
#: Shift_JIS is Windows-31J, EUC-KR is windows-949, ISO-8859-9 is windows-1254, TIS-620
#: and ISO-8859-11 are windows-874, Big5 includes HKSCS. Keys: Python codec names, or
#: labels Python does not know.
_WHATWG_CODECS = {"gb2312": "gb18030", "gbk": "gb18030", "x-gbk": "gb18030", "shift_jis": "cp932",
                  "windows-31j": "cp932", "x-sjis": "cp932", "euc_kr": "cp949", "iso8859-9": "cp1254",
                  "tis-620": "cp874", "iso8859-11": "cp874", "windows-874": "cp874", "big5": "big5hkscs",
                  "iso-8859-8-i": "iso8859-8", "x-mac-cyrillic": "mac-cyrillic", "koi8-ru": "koi8-u",
                  "utf-16": "utf-16-le"}
#: The Python codecs of the WHATWG Encoding Standard's encodings (section 4.2), after the
#: mapping above. A label Python knows for another codec (``utf-7``, ``utf-32``, EBCDIC's
#: ``cp500``) is no label a browser knows: it is ignored as an unknown one is, since decoding
#: with it would corrupt the text (UTF-7 reads "C++" as "C" and a base64 escape).
_WHATWG_ENCODINGS = frozenset({
    "utf-8", "cp866", "koi8-r", "koi8-u", "mac-roman", "mac-cyrillic", "cp874", "gb18030", "big5hkscs",
    "euc_jp", "iso2022_jp", "cp932", "cp949", "utf-16-be", "utf-16-le",
    *(f"iso8859-{n}" for n in (2, 3, 4, 5, 6, 7, 8, 10, 13, 14, 15, 16)),
    *(f"cp{n}" for n in range(1250, 1259)), *_AS_WINDOWS_1252,
})


def _codec_for(label: str) -> str | None:
    """Python codec name for a charset label, or ``None`` when it names no encoding of the
    WHATWG Encoding Standard that Python has (an unknown label, ``utf-7``, ``base64``)."""
    label = label.strip().strip("\"'").lower()
    try:
        name = _WHATWG_CODECS.get(label) or codecs.lookup(label).name
        name = _WHATWG_CODECS.get(name, name)
    except (LookupError, ValueError, TypeError):
        return None
    if name not in _WHATWG_ENCODINGS:  # utf-7, utf-32, EBCDIC; base64, rot13, zlib: no text encodings at all
        return None
    if name not in _AS_WINDOWS_1252:
        return name
    # ftfy (~40 ms to import) only when a page needs its codec or a repair, not in every process
    import ftfy.bad_codecs  # noqa: F401  registers the lossless "sloppy-windows-1252" codec

    return "sloppy-windows-1252"


def _meta_charset(body: bytes) -> bytes | None:
    """The label of the first ``<meta charset>`` or ``<meta http-equiv="Content-Type"
    content="...; charset=...">`` that ends within the first 4 KiB, outside comments (after
    the WHATWG prescan: ``charset=`` in another meta's content does not count); failing
    those, ``<meta name="Content-Type" content="...">``, which browsers ignore but pages write."""
    head = _COMMENT.sub(b"", body[:_META_SCAN_BYTES])
    by_name = None  # <meta name="Content-Type" ...>: browsers ignore it, so it counts only when nothing else does
    for tag in _META_TAG.finditer(head):
        attributes = {m.group(1).lower(): m.group(2) or m.group(3) or m.group(4) or b""
                      for m in _ATTRIBUTE.finditer(tag.group(), 5, len(tag.group()) - 1)}
        if charset := attributes.get(b"charset", b"").strip():
            return charset
        match = _CHARSET_IN_CONTENT.search(attributes.get(b"content", b""))
        if match and attributes.get(b"http-equiv", b"").strip().lower() == b"content-type":
            return match.group(1)
        if match and by_name is None and attributes.get(b"name", b"").strip().lower() == b"content-type":
            by_name = match.group(1)
    return by_name


def sniff_charset(body: bytes, content_type: str | None = None) -> str:
    """Choose the codec for an HTML body.

    Order (after the WHATWG HTML "determining the character encoding" algorithm, simplified):
    a byte-order mark, then the ``charset`` parameter of the ``Content-Type`` header
    (RFC 9110 section 8.3), then ``<meta charset>`` / ``<meta http-equiv>`` ending in the
    first 4 KiB (not in a comment), else UTF-8. Unknown labels are skipped; a ``<meta>``
    claiming UTF-16 means UTF-8 (the meta tag itself was readable as ASCII). Labels map to
    codecs as browsers map them (WHATWG Encoding Standard): ISO-8859-1, US-ASCII and
    windows-1252 all decode as windows-1252 with the undefined bytes kept as C1 controls
    (lossless); GB2312 as GB18030, Shift_JIS as cp932, EUC-KR as cp949, ISO-8859-9 as
    windows-1254, TIS-620 as windows-874, Big5 as Big5-HKSCS.

    One departure from browsers: a header naming another charset than the ``<meta>``'s
    UTF-8 loses to it when the body is valid UTF-8 with at least one byte above 0x7F (a
    server's default label on a page written in UTF-8: read by the header, "Noah’s" would
    load as "Noah窶冱" under Shift_JIS, mojibake that no check sees). Legacy text with
    bytes above 0x7F is almost never valid UTF-8; a body of ASCII bytes alone is read as
    the header says (ISO-2022-JP, a 7-bit encoding, is such a body).

    Args:
        body: the raw response body.
        content_type: the ``Content-Type`` header value, if any.

    Returns:
        A Python codec name usable with ``bytes.decode``.
    """
    for bom, codec in _BOMS:
        if body.startswith(bom):
            return codec
    if (label := header_charset(content_type)) and (codec := _codec_for(label)):
        if codec != "utf-8" and _meta_codec(body) == "utf-8" and _valid_utf8(body):
            return "utf-8"  # the page's own label, and its bytes agree with it
        return codec
    return _meta_codec(body) or "utf-8"


def _valid_utf8(body: bytes) -> bool:
    """Whether ``body`` is UTF-8 with a multi-byte sequence (ASCII alone proves nothing)."""
    if body.isascii():
        return False
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _meta_codec(body: bytes) -> str | None:
    """The codec the body's ``<meta>`` names (one claiming UTF-16 means UTF-8), None without a usable one."""
    label = _meta_charset(body)
    if label and (codec := _codec_for(label.decode("ascii", "replace"))):
        return "utf-8" if codec.startswith("utf-16") else codec
    return None


def meta_declared_codec(body: bytes) -> str | None:
    """The codec other than UTF-8 the page's own ``<meta>`` declares, when no byte-order mark
    overrides it: what :func:`sniff_charset` decodes the body with when its ``Content-Type``
    names no charset. None for a page that reads as UTF-8 without a header's word.

    The manifest keeps it (``PageEntry.meta_charset``) so that the same bytes served with and
    without ``charset=utf-8`` have different data versions: they read differently.
    """
    if any(body.startswith(bom) for bom, _ in _BOMS):
        return None
    codec = _meta_codec(body)
    return None if codec in (None, "utf-8") else codec


#: Each byte of windows-1252, the five it leaves undefined kept as C1 controls (lossless).
_WINDOWS_1252 = tuple(bytes([b]).decode("cp1252", "ignore") or chr(b) for b in range(256))


def _invalid_utf8_as_windows_1252(error: UnicodeDecodeError) -> tuple[str, int]:
    """``codecs`` error handler: bytes invalid in UTF-8 read as windows-1252, one by one."""
    return "".join(_WINDOWS_1252[b] for b in error.object[error.start : error.end]), error.end


codecs.register_error("scrape_assets.windows-1252", _invalid_utf8_as_windows_1252)


def _decode(body: bytes, content_type: str | None) -> str:
    codec = sniff_charset(body, content_type)
    # Bytes invalid in UTF-8 (a legacy page labelled UTF-8, a stray latin-1 byte in a
    # footer) read as windows-1252 each, not U+FFFD; valid sequences stay UTF-8.
    errors = "scrape_assets.windows-1252" if codec == "utf-8" else "replace"
    try:
        text = body.decode(codec, errors=errors)
    except (LookupError, UnicodeError, ValueError, TypeError):  # a codec that fails on this body after all
        text = body.decode("utf-8", errors="replace")
    return text[1:] if text.startswith("\ufeff") else text


#: A UTF-8 lead byte (0xC2-0xF4) followed by a continuation byte (0x80-0xBF), as they read
#: after a windows-1252/latin-1 decode: the signature of mojibake. Text without it is left
#: alone, which skips ftfy for the ~99% of fields that need nothing (a plain "£12.99").
_MOJIBAKE = re.compile(
    "[\u00c2-\u00f4][\u0080-\u00bf\u0152\u0153\u0160\u0161\u0178\u017d\u017e\u0192\u02c6\u02dc"
    "\u2013\u2014\u2018-\u201e\u2020-\u2022\u2026\u2030\u2039\u203a\u20ac\u2122]"
)


def repair_text(text: str) -> str:
    """Undo mojibake (UTF-8 read as windows-1252/latin-1, possibly twice) with ftfy.

    Only encoding repairs are applied (``ftfy.fix_encoding``): quotes stay curly and nothing
    else is normalised, so the result is safe to parse as HTML. ASCII text is returned as is.

    Example: ``"Â£51.77"`` -> ``"£51.77"``; ``"CafÃ©"`` -> ``"Café"``.
    """
    if text.isascii() or _MOJIBAKE.search(text) is None:
        return text  # no UTF-8 lead character followed by a continuation one: nothing to undo
    import ftfy  # imported on first use (see _codec_for)

    return ftfy.fix_encoding(text)


def decode_html(body: bytes, content_type: str | None = None) -> str:
    """Decode an HTML body to text and repair mojibake.

    The charset is chosen by :func:`sniff_charset`; bytes invalid in it become U+FFFD, so a
    wrong or missing charset never raises; but where UTF-8 was chosen (labelled so, or not
    labelled), each byte invalid in it is read as windows-1252 instead, the valid sequences
    staying UTF-8: a legacy page labelled UTF-8 reads "Crème" and "€" where a browser
    would show U+FFFD, and one stray latin-1 byte spoils nothing else. The whole document then goes through
    :func:`repair_text` (about 10 ms for a 50 KB page with mojibake; :func:`parse_listing`
    repairs extracted fields only, which is much faster).

    Args:
        body: the raw response body.
        content_type: the ``Content-Type`` header value, if any (``"text/html; charset=utf-8"``).

    Returns:
        The document text, e.g. containing ``"£51.77"`` where the bytes said ``"Â£51.77"``.
    """
    return repair_text(_decode(body, content_type))


# --- field parsers --------------------------------------------------------------------------

_CURRENCY_SYMBOLS = {"£": "GBP", "$": "USD", "€": "EUR", "¥": "JPY"}
#: Dollars (and pesos) named by letters before the "$" ("C$12.99", "US $5"); an ISO 4217
#: code there names its own ("USD$12.99", "AUD $5").
_DOLLAR_PREFIXES = {"US": "USD", "C": "CAD", "CA": "CAD", "A": "AUD", "AU": "AUD", "NZ": "NZD", "HK": "HKD",
                    "S": "SGD", "SG": "SGD", "NT": "TWD", "MX": "MXN", "R": "BRL", "RD": "DOP"}
_SYMBOL = re.compile(r"(?<![A-Za-z])(?:([A-Z]{1,3}) ?)?\$|[£€¥]")
_CODE_BEFORE = re.compile(r"(?<![A-Za-z])([A-Z]{3})\s*$")
_CODE_AFTER = re.compile(r"\s*([A-Z]{3})(?![A-Za-z])")
#: Digit-group separators: ' NBSP, narrow NBSP, thin space, ’ (Swiss "1’234.50").
_GROUP_MARKS = "'\u00a0\u202f\u2009\u2019"
#: An amount: digits, optionally grouped by , . or a separator above, ending in a digit;
#: or cents alone (".99").
_AMOUNT = re.compile(rf"\d(?:[\d.,{_GROUP_MARKS}]*\d)?|(?<![^\W\d_])[.,]\d\d(?!\d)")
_GROUPING = str.maketrans("", "", _GROUP_MARKS + " ")
#: Groups of three digits after spaces ("1 234,50 €", "1 299 kr"; the fields' whitespace is
#: collapsed to plain spaces before this), maybe with decimals or a dash for them.
_SPACE_GROUPS = re.compile(r"(?: \d{3}(?!\d))+(?P<decimals>[.,]\d{1,3}(?!\d)|[.,:][-\u2013\u2014])?")
#: A dash for the decimals ("1.299,-", "1 299:-", "CHF 12.–"): the mark before it is the decimal mark.
_DASH_DECIMALS = re.compile(r"([.,:])[-\u2013\u2014]")
#: The word or sign after space-grouped digits: a currency there makes them one amount.
_NEXT_TOKEN = re.compile(r"( *)([^\W\d_]+|\S)?")
#: Currency names written after amounts that are no ISO 4217 code (compared in lower case).
_CURRENCY_WORDS = frozenset({"kr", "kn", "zł", "zl", "kč", "kc", "ft", "lei", "tl", "din", "rs", "fr", "sfr", "руб",
                             "р", "лв", "грн", "tk", "euro", "euros", "eur"})
#: Cents written after the symbol, as French shops do: "12€99" is 12.99.
_SIGN_CENTS = re.compile(r"([£$€¥])(\d\d)(?!\d)")
#: Currency signs other than £ $ € ¥, and the ISO 4217 codes each may stand for (the spec's
#: currency when it is one of them, the only one otherwise; several: the price is refused).
_OTHER_SIGNS = {"₹": ("INR",), "₪": ("ILS",), "₩": ("KRW", "KPW"), "₽": ("RUB",), "₺": ("TRY",), "₫": ("VND",),
                "₱": ("PHP",), "₴": ("UAH",), "₦": ("NGN",), "₡": ("CRC",), "₲": ("PYG",), "₸": ("KZT",),
                "₼": ("AZN",), "₾": ("GEL",), "฿": ("THB",), "₭": ("LAK",), "₮": ("MNT",), "৳": ("BDT",),
                "₵": ("GHS",), "￥": ("JPY", "CNY"), "円": ("JPY",), "元": ("CNY",), "￡": ("GBP",), "＄": ("USD",),
                "﷼": ("SAR", "IRR", "YER", "OMR", "QAR")}
#: Currency words written right before or after an amount (compared in lower case), and their codes.
#: Only words that are no everyday abbreviation ("ft", "tl", "din", "fr" are feet, teaspoons, a
#: paper size, French): after the amount, or (``_WORDS_BEFORE``) before it.
_WORD_CODES = {"zł": ("PLN",), "zl": ("PLN",), "kr": ("SEK", "NOK", "DKK", "ISK"), "kč": ("CZK",), "kc": ("CZK",),
               "lei": ("RON", "MDL"), "руб": ("RUB", "BYN"), "лв": ("BGN",), "грн": ("UAH",), "euro": ("EUR",),
               "euros": ("EUR",), "rs": ("INR", "PKR", "LKR", "NPR", "MUR", "SCR")}
_WORDS_BEFORE = frozenset({"kr", "rs"})
_WORD_BEFORE = re.compile(r"(?<![^\W\d_])([^\W\d_]{1,5})\.?\s?$")
_WORD_AFTER = re.compile(r"\s?([^\W\d_]{1,5})(?![^\W\d_])")
#: Currencies written in Arabic letters (a riyal "ر.س", a dirham "د.إ", ...).
_ARABIC_ABBREVIATIONS = {"ر.س": ("SAR",), "د.إ": ("AED",), "د.ك": ("KWD",), "ر.ق": ("QAR",), "ج.م": ("EGP",),
                         "د.ا": ("JOD",), "ر.ع": ("OMR",), "د.ب": ("BHD",), "د.ج": ("DZD",), "د.م": ("MAD",)}
#: Eastern Arabic digits and separators, read as ASCII ones ("٥١٫٧٧" is 51.77).
_ARABIC = str.maketrans({**{chr(0x660 + d): str(d) for d in range(10)}, **{chr(0x6F0 + d): str(d) for d in range(10)},
                         "\u066b": ".", "\u066c": ","})


def _is_sign(char: str) -> bool:
    """Whether ``char`` is a currency sign: Unicode category Sc ($ £ € ₹ ...) or one of
    :data:`_OTHER_SIGNS` written with a letter (円, 元, the full-width ones)."""
    return len(char) == 1 and (unicodedata.category(char) == "Sc" or char in _OTHER_SIGNS)


def _sign_currency(sign: str, default_currency: str) -> str:
    """The currency one of £ $ € ¥ stands for on a site priced in ``default_currency``: that
    currency when it may be written with the sign ("$" on a CAD site), else £ GBP, $ USD, € EUR, ¥ JPY."""
    return default_currency if _suits(default_currency, sign) else _CURRENCY_SYMBOLS[sign]


def _currency_word(text: str, start: int, end: int) -> str | None:
    """A currency word of :data:`_WORD_CODES` right after the amount at ``text[start:end]``
    ("15,99 zł"), or one of :data:`_WORDS_BEFORE` right before it ("Rs. 1,299"), as written."""
    before, after = _WORD_BEFORE.search(text, max(0, start - 8), start), _WORD_AFTER.match(text, end)
    return next((w.group(1) for w, where in ((before, _WORDS_BEFORE), (after, _WORD_CODES))
                 if w and w.group(1).lower() in where), None)


def _is_currency_marker(token: str) -> bool:
    """A currency sign (Unicode category Sc: $ £ € ₹ ₽ ...), an ISO 4217 code, or a currency word."""
    if len(token) == 1 and unicodedata.category(token) == "Sc":
        return True
    return (len(token) == 3 and token.isupper() and is_price_currency(token)) or token.lower() in _CURRENCY_WORDS


def _space_grouped_end(text: str, end: int) -> int | None:
    """Where the amount ends if the 1-3 digits ending at ``end`` go on in space-separated
    groups of three ("1 299"), or None when those groups are something else: a quantity
    or a unit after the price ("£10 500g", "£3 250 ml", "£12 120 reviews", "$20 500+ sold").

    They are one amount when decimals (or a dash for them) follow the groups ("1 234,50"),
    when nothing does, or when the next word or sign is a currency ("1 299 kr", "1 299SEK",
    "1 234 €/kg") or punctuation other than % and + ("£1 299 + VAT" is spaced, so counts).
    """
    groups = _SPACE_GROUPS.match(text, end)
    if groups is None:
        return None
    if groups.group("decimals"):
        return groups.end()
    gap, token = _NEXT_TOKEN.match(text, groups.end()).groups()
    if not token or _is_currency_marker(token):
        return groups.end()
    if token.isalpha() or token == "%" or (token == "+" and not gap):
        return None  # a unit or a word: "500g", "250 ml", "100 %", "500+"
    return groups.end()


#: A minus sign (ASCII or U+2212) against the amount or its symbol: "-£5", "−5 €", "-USD 5";
#: not "Sale - £12.99".
_MINUS_BEFORE = re.compile(r"[-\u2212](?:[A-Z]{3} ?|[A-Z]{0,2}\$ ?|[£€¥] ?)?$")
#: Accounting parentheses around nothing but the amount and its currency: "(£5.00)".
_PARENTHESES = re.compile(rf"\s*\(\s*(?:[A-Z]{{0,3}} ?\$|[£€¥]|[A-Z]{{3}})?\s*[\d.,{_GROUP_MARKS} ]+\s*(?:[£€¥]|[A-Z]{{3}})?\s*\)\s*")
#: Minor units right after the amount: "99p" (pence), "99¢" (cents); not "25 p.p." (per person).
_MINOR_AFTER = re.compile(r"\s*([p¢])(?![A-Za-z.])")
#: The common case, read directly: an optional symbol, digits, maybe a "." and two decimals.
_SIMPLE_PRICE = re.compile(r"\s*([£$€¥]?)\s*(\d+(?:\.\d\d)?)\s*")
#: ISO 4217 currencies with three decimal digits: "1.250 KWD" is one dinar and a quarter.
_THREE_DECIMALS = frozenset({"BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"})
#: Currencies priced without decimals (ISO 4217 minor unit 0, and the rupiah, whose cents
#: no shop shows): "Rp 125.000", "12.900 ₫", "$1.299" on a CLP site group thousands.
_NO_DECIMALS = frozenset({"BIF", "CLP", "DJF", "GNF", "IDR", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX",
                          "UYI", "VND", "VUV", "XAF", "XOF", "XPF"})
#: How digits may be grouped before the decimal mark: in threes, or India's lakh and crore
#: ("1,23,45,678": twos, then the last three).
_VALID_GROUPING = {",": re.compile(r"\d{1,3}(?:,\d{3})*|\d{1,2}(?:,\d{2})*,\d{3}"),
                   ".": re.compile(r"\d{1,3}(?:\.\d{3})*")}


def _amount(raw: str, *, three_decimals: bool = False, no_decimals: bool = False,
            decimal_mark: str | None = None) -> str:
    """Normalise a matched amount to Decimal syntax: decide which of , and . is the decimal mark.

    ``decimal_mark`` (the spec's) decides: the other mark must group exactly three digits
    ("51.77" with ``decimal_mark=","`` is refused, not read 5177). Unset: when both appear,
    the last; a lone "," before exactly three digits (after a non-zero integer part) groups
    thousands ("1,234"), else it is the decimal mark ("3,50"); a lone "." is the decimal
    mark, but before exactly three digits after a non-zero integer part it is ambiguous
    ("1.250": 1250 in German, 1.25 in English) unless the currency settles it: three
    decimal digits (``three_decimals``: a decimal mark) or none (``no_decimals``: grouping).

    Raises:
        ValueError: an ambiguous ".", or grouping that does not fit ``decimal_mark`` (the
            message says what to set or what was expected).
    """
    raw = raw.translate(_GROUPING)
    if decimal_mark is not None:
        grouping = "." if decimal_mark == "," else ","
        integer, _, fraction = raw.partition(decimal_mark)
        if grouping in fraction or (grouping in integer and not _VALID_GROUPING[grouping].fullmatch(integer)):
            raise ValueError(f"{raw!r} does not fit the spec's decimal_mark {decimal_mark!r} (its "
                             f"{grouping!r} should group thousands, three digits each)")
        return raw.replace(grouping, "").replace(decimal_mark, ".")
    if "," in raw and "." in raw:
        decimal_mark = "," if raw.rfind(",") > raw.rfind(".") else "."
        grouping = "." if decimal_mark == "," else ","
        return raw.replace(grouping, "").replace(decimal_mark, ".")
    for mark in ",.":
        if raw.count(mark) > 1:  # "1.234.567", "1,234,567"
            return raw.replace(mark, "")
        if raw.count(mark) == 1:
            integer, _, fraction = raw.partition(mark)
            if len(fraction) != 3 or integer.strip("0") == "" or (mark == "." and three_decimals):
                return f"{integer}.{fraction}"
            if mark == "," or no_decimals:
                return integer + fraction
            raise ValueError(f"{raw!r} may be {integer}{fraction} ('.' grouping thousands) or {integer}.{fraction}: "
                             "set the spec's decimal_mark")
    return raw


#: The codes each symbol stands for besides its own (the dollars: any code ending in D, and
#: the pesos written with "$").
_SYMBOL_CODES = {"£": ("GBP", "GIP", "FKP", "SHP", "EGP"), "€": ("EUR",), "¥": ("JPY", "CNY"),
                 "$": ("MXN", "ARS", "CLP", "COP", "CUP", "DOP", "UYU")}


def parse_price(text: str, default_currency: str, *, decimal_mark: str | None = None) -> tuple[Decimal, str]:
    """Parse a displayed price into an exact amount and an ISO 4217 currency code.

    The amount is the only number in ``text``, or, of several, as :func:`_the_amount` chooses
    ("20% off £45.17" is 45.17, "Only 3 left! £12.99" 12.99, "12,99 - 15,99 €" 12.99, "Was £20
    Now £12" 20). Its decimal mark is ``decimal_mark`` when
    given (the spec's), the other of ``,`` and ``.`` grouping thousands. Otherwise it is
    guessed: of ``,`` and ``.``, the one appearing last when both appear; a lone ``,``
    before exactly 3 digits groups thousands (``"$1,234"``), else it is the decimal mark
    (``"€3,50"``); a lone ``.`` is the decimal mark (``"£.99"``, ``"0.125"``, ``"1.250 KWD"``
    in a currency with three decimal digits), groups thousands in a currency priced without
    decimals (``"Rp 125.000"``, ``"$1.299"`` on a CLP site) or before a dash for the
    decimals (``"1.299,-"``), but ``"€1.250"`` is ambiguous (1250 as German shops write it,
    or 1.25): a ValueError asks for the spec's ``decimal_mark``, which, when set, also
    refuses grouping not written its way (``"51.77"`` with ``","``; India's ``"1,23,456"``
    fits ``"."``). Digits may be grouped by ``'``, ``’``, or spaces of any kind (``"1 234,50
    €"``, ``"1 299 kr"``, ``"1 299SEK"``), unless a quantity or unit follows the groups
    (``"£10 500g"``, ``"£3 250 ml"``, ``"£12 120 reviews"`` are 10, 3 and 12; see
    :func:`_space_grouped_end`). ``"12€99"`` is 12.99. A minus sign
    against the amount or its symbol (``"-£5.00"``, ``"−5 €"``; not ``"Sale - £5"``) or
    accounting parentheses around nothing but the price (``"(£5.00)"``) make it negative;
    ``"99p"`` and ``"99¢"`` are pence and cents (0.99).

    The currency is, in this order: an ISO 4217 code right before or after the amount
    (``"GBP 12.00"``, ``"12.00 EUR"``, ``"$12 CAD"``; not ``"RRP £12"``; a 3-letter word that
    is no such code, as in ``"£12.00 VAT"``, is not one, nor a code that does not suit the
    symbol beside it, as in ``"£12.00 TOP"``); the dollar letters before ``$`` name
    (``"C$"``/``"CA$"`` CAD, ``"A$"``/``"AU$"`` AUD, ``"NZ$"``, ``"HK$"``, ``"S$"``/``"SG$"``,
    ``"NT$"``, ``"MX$"``, ``"R$"`` BRL, ``"RD$"`` DOP, ``"US$"``/``"US $"`` USD, or a code:
    ``"USD$"``, ``"AUD $"``); a symbol: ``default_currency`` when it is written with that
    symbol (``"$12.99"`` on a CAD or MXN site, ``"¥"`` on a CNY site), else £ GBP, $ USD,
    € EUR, ¥ JPY (pence GBP, cents USD); another sign or currency word (``"₹"`` INR, ``"zł"``
    PLN, ``"円"`` JPY, ``"kr"``: see :func:`_other_currency`); a symbol only inside
    parentheses (``"12,99 (1 kg = 6,50 €)"``); else ``default_currency``. Signs inside
    parentheses count only then: ``"CHF 12.50 (€ 13.10)"`` is CHF.
    Eastern Arabic digits and separators read as ASCII ones (``"٥١٫٧٧"`` is 51.77).
    Limits: without a symbol, a word that is also a code (``"ALL 12.00"``: Albanian lek) is
    read as that currency; a currency written in words this parser does not list
    (``"12 dollars"``) is ``default_currency``. A price split over elements is read by
    :func:`_price_text` before it gets here (``"$12<sup>99</sup>"`` is 12.99).
    Mojibake before the symbol (``"Â£51.77"``) is ignored.

    Args:
        text: the price as displayed, e.g. ``"£51.77"``.
        default_currency: ISO 4217 code used when the text names no currency (the spec's).
        decimal_mark: ``"."``, ``","`` or ``None`` (guess per price; the spec's ``decimal_mark``).

    Returns:
        ``(amount, currency)``, e.g. ``(Decimal("51.77"), "GBP")``; the amount keeps the
        digits shown (no float rounding).

    Raises:
        ValueError: no number in ``text``, only a percentage, more than
            :data:`MAX_PRICE_TEXT` characters, an ambiguous amount, one ``decimal_mark``
            cannot read, or a currency sign that may not be the spec's currency; the message
            quotes ``text``.
    """
    if (simple := _SIMPLE_PRICE.fullmatch(text)) and not (decimal_mark == "," and "." in simple.group(2)):
        # "£51.77", "12.00": what the general path below gives, without its dozen regex steps
        sign = simple.group(1)
        return Decimal(simple.group(2)), _sign_currency(sign, default_currency) if sign else default_currency
    if len(text) > MAX_PRICE_TEXT:
        raise ValueError(f"{len(text):,} characters of price text ({text[:40]!r}...): more than a price; point the "
                         "spec's price selector at the price alone")
    if not text.isascii():
        text = text.translate(_ARABIC)
    match, range_end = _the_amount(text)
    raw, end = match.group(), match.end()
    if raw.isdigit() and len(raw) <= 3 and (grouped := _space_grouped_end(text, end)) is not None:
        raw, end = text[match.start():grouped], grouped  # "1 234,50 €", "1 299 kr", "2 499,-"
    dash_in_raw = _DASH_DECIMALS.match(raw, len(raw) - 2)  # "2 499,-": the groups took the dash along
    if dash := dash_in_raw or _DASH_DECIMALS.match(text, end):
        # "1.299,- €", "2 499,–": the mark before the dash is the decimal mark
        raw = raw[:-2] if dash_in_raw else raw
        if dash.group(1) != ":" and decimal_mark not in (None, dash.group(1)):
            raise ValueError(f"in {text!r}, {dash.group(1)!r} before the dash is a decimal mark, but the spec's "
                             f"decimal_mark is {decimal_mark!r}")
        decimal_mark = dash.group(1) if dash.group(1) != ":" else decimal_mark
    elif cents := _SIGN_CENTS.match(text, end) if raw.translate(_GROUPING).isdigit() else None:
        raw, end = f"{raw}{decimal_mark or '.'}{cents.group(2)}", cents.end()  # "12€99"
    # The sign of the amount's part of the text, not of a conversion in parentheses ("CHF 12.50
    # (€ 13.10)", "₹1,299 ($15.60)"); one only there counts last ("12,99 (1 kg = 6,50 €)").
    symbol = _SYMBOL.search(_outside_parentheses(text))
    minor = _MINOR_AFTER.match(text, end) if raw.isdigit() else None  # "99p", not "12.99 p/kg"
    currency = None
    for code in (_CODE_BEFORE.search(text, 0, match.start()), _CODE_AFTER.match(text, end),
                 None if range_end is None else _CODE_AFTER.match(text, range_end)):  # "12.99 - 15.99 USD"
        # Not "£12.00 VAT", "NOW 12.00" (no such code), nor "£12.00 TOP" (a code, but not a pound):
        # codes that are also words (ALL, TOP, TRY...) count, but beside a symbol must suit it
        if code and is_price_currency(code.group(1)) and (symbol is None or _suits(code.group(1), symbol.group()[-1])):
            currency = code.group(1)
            break
    if currency is None and symbol is not None:
        currency = _symbol_currency(symbol, default_currency)
    if currency is None and minor is not None:
        currency = _sign_currency("£" if minor.group(1) == "p" else "$", default_currency)
    currency = currency or _other_currency(text, match.start(), end if range_end is None else range_end,
                                           default_currency)
    if currency is None and (enclosed := _SYMBOL.search(text)) is not None:  # "(C$5.00)", "12,99 (1 kg = 6,50 €)"
        currency = _symbol_currency(enclosed, default_currency)
    currency = currency or default_currency
    try:
        amount = Decimal(_amount(raw, three_decimals=currency in _THREE_DECIMALS, no_decimals=currency in _NO_DECIMALS,
                                 decimal_mark=decimal_mark))
    except InvalidOperation:  # "1.234.56" with decimal_mark "."
        raise ValueError(f"cannot read the amount {raw!r} in {text!r}") from None
    except ValueError as exc:  # ambiguous, or not as the spec's decimal_mark says
        raise ValueError(f"in {text!r}, {exc}") from None
    if minor is not None and symbol is None:
        amount = amount.scaleb(-2)  # 99p -> 0.99
    if _MINUS_BEFORE.search(text, 0, match.start()) or _PARENTHESES.fullmatch(text):
        amount = -amount
    return amount, currency


#: A percentage right after an amount ("20% off"): never a price.
_PERCENT = re.compile(r" ?%")
#: What joins the two ends of a price range ("£12.99 - £15.99", "12,99 - 15,99 €", "ab 12,99 bis 15,99 €"):
#: a dash or tilde, "to", "bis" or "à", maybe with a sign or ISO code on either side.
_RANGE = re.compile(r"\s*(?:[^\w\s]{1,2}|[A-Z]{3})?\s*(?:[-\u2013\u2014~]|\bto\b|\bbis\b|à)\s*"
                    r"(?:[A-Z]{1,3}\s?\$|[^\w\s]{1,2}|[A-Z]{3})?\s*")
#: The longest price text read, in characters (a selector matching more than the price: refused).
MAX_PRICE_TEXT = 300


def _amount_spans(text: str) -> list[tuple[re.Match, int]]:
    """Each amount in ``text`` as :func:`parse_price` reads one: ``(its first match, where it
    ends)``, space-grouped digits ("1 299 kr") and cents after a sign ("12€99") taken along."""
    spans, pos = [], 0
    while (match := _AMOUNT.search(text, pos)) is not None:
        end = match.end()
        if match.group().isdigit() and len(match.group()) <= 3 and (grouped := _space_grouped_end(text, end)):
            end = grouped
        if (cents := _SIGN_CENTS.match(text, end)) and text[match.start():end].translate(_GROUPING).isdigit():
            end = cents.end()
        spans.append((match, end))
        pos = end
    return spans


#: A currency sign or ISO 4217 code right before an amount (spaces, a minus or "(" between),
#: or right after it.
_SIGN_OR_CODE_BEFORE = re.compile(r"(?:(?<![A-Za-z])([A-Z]{3})|(\S))[ \u00a0\-\u2212(]*$")
_SIGN_OR_CODE_AFTER = re.compile(r"[ \u00a0]*(?:([A-Z]{3})(?![A-Za-z])|(\S))")


def _marked(text: str, start: int, end: int) -> bool:
    """Whether a currency sign (Unicode Sc, or one of :data:`_OTHER_SIGNS`), an ISO 4217 code or
    a currency word of :data:`_WORD_CODES` is right before or after ``text[start:end]``, or in
    it ("12€99"). A sign between two amounts marks the one it touches: in "Pack of 6 £12.99"
    the "£" is 12.99's."""
    if any(_is_sign(c) for c in text[start:end] if not c.isdigit()):
        return True
    before = _SIGN_OR_CODE_BEFORE.search(text, max(0, start - 8), start)
    after = _SIGN_OR_CODE_AFTER.match(text, end)
    if before and before.group(1) and is_price_currency(before.group(1)):
        return True
    if after and after.group(1) and is_price_currency(after.group(1)):
        return True
    if _currency_word(text, start, end):  # "15,99 zł", "Rs. 1,299": none is an everyday abbreviation
        return True
    # "6 £12.99": the "£" after 6 is spaced from it and touches 12.99
    touching_next = after and after.group(2) and after.end() < len(text) and text[after.end()].isdigit() \
        and after.start(2) > end
    touching_previous = before and before.group(2) and before.start(2) > 0 and text[before.start(2) - 1].isdigit() \
        and before.end(2) < start
    return bool((before and before.group(2) and _is_sign(before.group(2)) and not touching_previous)
                or (after and after.group(2) and _is_sign(after.group(2)) and not touching_next))


def _the_amount(text: str) -> tuple[re.Match, int | None]:
    """The match of the price's amount in ``text``, and where the range it starts ends (None
    when it starts none: a currency written after a range's high end is the range's).

    A percentage is never the amount ("20% off £45.17"). Of several, those outside
    parentheses first ("12,99 (1 kg = 6,50 €)": a unit price); a range with a currency at
    either end is its low end ("£12.99 - £15.99", "12,99 - 15,99 €"; not "Ships in 3-5
    days $12.99"); the first amount when a currency marks it or it is more than a small
    whole number ("12,99 6,50 €/kg": 12.99); after a small whole number (a count: "Only 3
    left! £12.99", "Pack of 6 £12.99", "Qty: 3 $12.99", "Najniższa cena z 30 dni: 15,99
    zł"), the first amount a currency marks, unless that is a unit price ("12 6,50 €/kg",
    "25 $1.25/oz": 12 and 25), or that small number when none is marked.
    Limit: of two marked amounts the first counts ("Was £20 Now £12" is 20, "£12.99 RRP
    £15" is 12.99: point the selector at the current price).

    Raises:
        ValueError: no amount, or only a percentage.
    """
    spans = _amount_spans(text)
    if not spans:
        raise ValueError(f"no number in {text!r} (expected an amount such as '£51.77')")
    priced = [(m, end) for m, end in spans if not _PERCENT.match(text, end)]
    if not priced:
        raise ValueError(f"no price in {text!r}, only a percentage")
    if len(priced) == 1:
        return priced[0][0], None
    outside = [(m, end) for m, end in priced
               if text.count("(", 0, m.start()) <= text.count(")", 0, m.start())] or priced
    (first, first_end), rest = outside[0], outside[1:]
    if rest and _RANGE.fullmatch(text, first_end, rest[0][0].start()) and (
            _marked(text, first.start(), first_end) or _marked(text, rest[0][0].start(), rest[0][1])):
        return first, rest[0][1]
    if _marked(text, first.start(), first_end) or not re.fullmatch(r"\d{1,3}", text[first.start():first_end]):
        return first, None
    later = next(((m, end) for m, end in rest if _marked(text, m.start(), end)), None)
    if later is None or _UNIT_PRICE_AFTER.match(text, later[1]):  # "12 6,50 €/kg": the 12 is the price
        return first, None
    return later[0], None


#: What follows a unit price's amount ("6,50 €/kg", "$0.81 per oz", "£0.30 each").
_UNIT_PRICE_AFTER = re.compile(r"\s*(?:[^\w\s/]{1,2}\s*)?(?:/|(?:per|pro|je|each|la|le)\b)", re.IGNORECASE)


def _outside_parentheses(text: str) -> str:
    """``text`` with what parentheses enclose blanked out (same length: positions stay)."""
    if "(" not in text:
        return text
    return re.sub(r"\([^()]*\)", lambda m: " " * len(m.group()), text)


def _other_currency(text: str, start: int, end: int, default_currency: str) -> str | None:
    """The currency a sign or word other than £ $ € ¥ names in ``text`` (a sign anywhere, a word
    right before or after the amount at ``text[start:end]``), or None when there is none.

    Returns the spec's ``default_currency`` when the sign may stand for it ("kr" on a SEK
    site), else the sign's one code ("₹": INR).

    Raises:
        ValueError: the sign may stand for several codes, none the spec's ("kr" on a GBP
            site), or for none ISO 4217 lists as a price currency, or is a currency sign this
            parser does not know (Unicode category Sc).
    """
    scope = _outside_parentheses(text)  # "₹1,299 ($15.60)": the rupee's
    found = next((c for c in scope if _is_sign(c) and c != "¢"), None)
    if found is not None and found in _CURRENCY_SYMBOLS:  # "Sale price$12.99": a "$" _SYMBOL does not take
        return _sign_currency(found, default_currency)
    found = found or next((a for a in _ARABIC_ABBREVIATIONS if a in text), None)
    found = found or _currency_word(text, start, end)
    if found is None:
        return None
    named = _OTHER_SIGNS.get(found) or _ARABIC_ABBREVIATIONS.get(found) or _WORD_CODES.get(found.lower(), ())
    codes = [c for c in named if is_price_currency(c)]
    if default_currency in codes:
        return default_currency
    if len(codes) == 1:
        return codes[0]
    may_be = f"may be {' or '.join(codes)}" if codes else "names no currency this parser knows"
    raise ValueError(f"{text!r} is priced in {found!r}, which {may_be}; the spec's currency is {default_currency} "
                     "(set the spec's currency to the site's)")


def _symbol_currency(symbol: re.Match, default_currency: str) -> str:
    """The currency a :data:`_SYMBOL` match names (see :func:`parse_price`)."""
    sign, letters = symbol.group()[-1], symbol.group(1)
    if letters in _DOLLAR_PREFIXES:
        return _DOLLAR_PREFIXES[letters]
    if letters and len(letters) == 3 and is_price_currency(letters) and _suits(letters, sign):
        return letters  # "USD$12.99", "AUD $5"
    return _sign_currency(sign, default_currency)  # "$12.99", "RRP $12.99"


def _suits(code: str, symbol: str) -> bool:
    """Whether currency ``code`` may be written with ``symbol`` ("$12 CAD": yes; "£12 TOP": no)."""
    return code in _SYMBOL_CODES.get(symbol, ()) or (symbol == "$" and code.endswith("D"))


_RATING_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}


#: A whole rating out of 5 written as a number: "4", "4.0", "4/5", "4 of 5", "4 out of 5 stars".
_RATING_NUMBER = re.compile(r"\s*([1-5])(?:[.,]0+)?\s*(?:(?:/|of|out\s+of)\s*5(?:[.,]0+)?)?\s*(?:stars?)?\s*",
                            re.IGNORECASE)


def parse_rating(value: str) -> int:
    """Read a star rating: a class attribute such as ``"star-rating Three"``, or a number.

    Args:
        value: space-separated words of which exactly one is One..Five (any case), as in
            books.toscrape.com's class attribute; else the whole text a whole number 1..5,
            alone or out of 5 (``"4"``, ``"4/5"``, ``"4 of 5"``, ``"4 out of 5 stars"``).

    Returns:
        The rating, 1..5.

    Raises:
        ValueError: neither form (a half star such as ``"4.5/5"`` too), or two rating words;
            the message quotes ``value``.
    """
    found = {_RATING_WORDS[token.lower()] for token in value.split() if token.lower() in _RATING_WORDS}
    if len(found) == 1:
        return found.pop()
    if not found and (number := _RATING_NUMBER.fullmatch(value)):
        return int(number.group(1))
    raise ValueError(f"expected exactly one rating word One..Five, or a whole number 1..5 out of 5 ('4', '4/5'), "
                     f"in {value!r}")


# --- page structure -------------------------------------------------------------------------


@dataclass(frozen=True)
class PagerInfo:
    """What a listing page says about pagination.

    Attributes:
        current_page: X of "Page X of N" (1-based), ``None`` when the page has no pager.
        total_pages: N of "Page X of N", ``None`` when the page has no pager.
        next_url: absolute URL of the ``next`` link, resolved against the URL the page was
            fetched from (so a crawl of a mirror stays on the mirror); ``None`` on the last page.
        results_count: the number of results the site claims for the listing ("32 results"),
            ``None`` when the spec names no such element or the page lacks it.
        next_link_error: why the ``next`` link's ``href`` could not be resolved (``next_url``
            is then ``None``), e.g. ``"'http://[bad/' (Invalid IPv6 URL)"``; ``None`` otherwise.
        shows_listing: the page has one of the spec's pagination elements (pager, ``next``
            link) whatever its text, or a results count that reads ("0 results" is an empty
            listing); a page with none of them and no product card is no listing page (a
            results element without a number, "No results" or a script's "{{ total }}",
            cannot tell an empty listing from a page that does not show it).
    """

    current_page: int | None
    total_pages: int | None
    next_url: str | None
    results_count: int | None
    next_link_error: str | None = None
    shows_listing: bool = False


@dataclass(frozen=True)
class Reject:
    """A product card that could not be parsed.

    Attributes:
        url: the product URL when it could be read (canonical, like product rows), else the
            URL of the page.
        reason: ``"<field>: <what went wrong>"``, e.g. ``"price: no number in ''"``.
        product_id: the card's product id when it was read before the field that failed
            (``products_table`` keeps that product's earlier row), else None.
    """

    url: str | None
    reason: str
    product_id: str | None = None


@dataclass(frozen=True)
class ParsedPage:
    """One parsed listing page.

    Attributes:
        products: one dict per readable card, keys ``product_id`` (str), ``title`` (str),
            ``price`` (``decimal.Decimal``, in ``currency`` units), ``currency`` (ISO 4217),
            ``rating`` (int 1..5), ``availability`` (str, whitespace collapsed, e.g.
            ``"In stock"``), ``url`` (absolute, canonical host).
        rejects: cards that matched the product selector but lacked a readable field.
        pager: what the pager says.
        cards_found: number of elements matching the product selector
            (``len(products) + len(rejects)``).
    """

    products: list[dict]
    rejects: list[Reject]
    pager: PagerInfo
    cards_found: int


@lru_cache(maxsize=64)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


_INTEGER = re.compile(r"\d[\d,.]*")
#: A digit-group separator inside a number ("1,234", "1.234", "1’234"; not a plain space:
#: "Page 1 of 3 120 books" is 3 pages), to drop
#: before the spec's pager_regex reads "Page 1 of 1,234" (its \d+ would read 1).
_DIGIT_GROUP_MARK = re.compile(r"(?<=\d)[,.'\u00a0\u202f\u2009\u2019](?=\d{3}(?!\d))")
#: The same in a results count, plain spaces too ("1 234 results": 1,000+ results are common,
#: a count followed by another 3-digit number is not).
_COUNT_GROUP_MARK = re.compile(r"(?<=\d)[,.'\u00a0\u202f\u2009\u2019 ](?=\d{3}(?!\d))")
#: Longest page number or results count read (a longer one is read as none: Python refuses to
#: convert more than 4,300 digits, and no listing has 10**18 pages).
_MAX_DIGITS = 18


def _tree(html_or_tree: LexborHTMLParser | str | bytes, content_type: str | None) -> LexborHTMLParser:
    if isinstance(html_or_tree, LexborHTMLParser):
        return html_or_tree
    if isinstance(html_or_tree, bytes):
        html_or_tree = _decode(html_or_tree, content_type)
    return LexborHTMLParser(html_or_tree)


def parse_pager(
    html_or_tree: LexborHTMLParser | str | bytes, spec: SiteSpec, page_url: str, *, content_type: str | None = None,
    base: str | None = None,
) -> PagerInfo:
    """Read the pager, the ``next`` link and the results count of a listing page.

    Args:
        html_or_tree: the page as a parsed tree, decoded text, or raw bytes. Prefer raw bytes
            to :func:`decode_html` output: the pager is ASCII, so bytes skip the costly
            whole-document mojibake repair (~0.3 ms instead of ~10 ms for a 50 KB page).
        spec: the site spec; uses ``spec.pagination`` (``pager``, ``pager_regex``,
            ``next_link``, ``results_count``). A selector the spec leaves out yields ``None``.
        page_url: absolute URL the page was fetched from; the ``next`` link is resolved
            against it, or against the page's ``<base href>`` when that is on the same origin.
        content_type: the ``Content-Type`` header, for the charset when given bytes.
        base: the page's document base (:func:`_document_base`) when the caller has it
            already; else found here, for a next link.

    Returns:
        The :class:`PagerInfo`. Digit-group separators are dropped first (``"Page 1 of
        1,234"`` and ``"1 234 results"`` read 1234; a plain space groups digits only in the
        count: ``"Page 1 of 3 120 books"`` is 3 pages). A pager element whose text does not match ``pager_regex``
        counts as no pager (``None``, ``None``); a results element without digits gives
        ``results_count=None``.
    """
    tree = _tree(html_or_tree, content_type)
    pagination = spec.pagination
    current = total = None
    shows_listing = False
    if pagination.pager and (node := tree.css_first(pagination.pager)) is not None:
        shows_listing = True
        if (match := _compiled(pagination.pager_regex).search(_DIGIT_GROUP_MARK.sub("", node.text()))) and max(
                len(match.group(1)), len(match.group(2))) <= _MAX_DIGITS:  # "Page 1 of 99...9": no pager
            current, total = int(match.group(1)), int(match.group(2))
    next_url = next_link_error = None
    if pagination.next_link and (node := tree.css_first(pagination.next_link)) is not None:
        shows_listing = True
        href = (node.attributes.get("href") or "").strip()
        # For fetching: against the page's <base href> only on the page's own origin (a mirror stays one).
        base = base or _document_base(tree, page_url)
        base = base if _same_origin(base, page_url) else page_url
        try:
            next_url = urljoin(base, href) if href else None
        except ValueError as exc:  # "http://[bad/": urlsplit refuses it; a dead end, not a crash
            next_link_error = f"{href!r} ({exc})"
    results = None
    if pagination.results_count and (node := tree.css_first(pagination.results_count)) is not None:
        if (match := _INTEGER.search(_COUNT_GROUP_MARK.sub("", node.text()))) and len(
                digits := re.sub(r"\D", "", match.group())) <= _MAX_DIGITS:
            results = int(digits)
            # Only a count that reads shows the listing: "0 results" is an empty one, but an
            # element with no number in it ("{{ total }}" of a page rendered by script, "No
            # results") cannot tell an empty listing from one this page does not show.
            shows_listing = True
    return PagerInfo(current_page=current, total_pages=total, next_url=next_url, results_count=results,
                     next_link_error=next_link_error, shows_listing=shows_listing)


#: Characters of a plain path: no query, fragment, params (";", which urlparse splits off),
#: scheme or authority (":", "//"), whitespace or control character.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,=@%/]*")
#: The leading dot segments of a relative path (``../../``), or the ``/`` of an absolute one.
_PATH_PREFIX = re.compile(r"/|(?:\.\.?/)*")


def _document_base(tree: LexborHTMLParser, page_url: str) -> str:
    """The URL a page's relative links resolve against: its first ``<base href>`` resolved
    against ``page_url``, else ``page_url`` (the HTML Standard's "document base URL"; a base
    that does not parse, or is no http(s) URL, is ignored as browsers ignore data: and
    javascript: ones)."""
    node = tree.css_first("base[href]")
    if node is None:
        return page_url
    try:
        base = urljoin(page_url, (node.attributes.get("href") or "").strip())
        return base if urlsplit(base).scheme.lower() in ("http", "https") else page_url
    except ValueError:  # "http://[bad/"
        return page_url


def _same_origin(a: str, b: str) -> bool:
    try:
        return _origin(urlsplit(a)) == _origin(urlsplit(b))
    except ValueError:
        return False


class UrlJoiner:
    """``urljoin(base, href)`` for the many links of one page, their common prefix resolved once.

    The product links of a listing page share their leading dot segments
    (``../../../item_12/index.html``, ``../../../item_13/index.html``). For a plain path,
    resolving it against ``base`` (RFC 3986 §5.2) gives the resolution of that prefix
    (``../../../``, ``/`` or nothing) followed by the rest unchanged, as long as the rest
    has no dot segment of its own. So each distinct prefix goes through
    :func:`urllib.parse.urljoin` once and the rest is appended. Any other ``href`` (a scheme
    or authority, a query, a fragment, ``;``, whitespace, ``//``, a ``.`` or ``..`` after the
    prefix, an empty one) goes to ``urljoin`` whole. Results equal ``urljoin``'s (tested
    against it); about 3x less CPU per link. Bases that are not absolute hierarchical URLs
    (no scheme or host, ``about:blank``) always go to ``urljoin``.
    """

    def __init__(self, base: str):
        self.base = base
        self._prefixes: dict[str, str] = {}
        parts = urlsplit(base)
        # Only against a hierarchical absolute base (a page URL): urljoin treats others apart.
        self._by_prefix = parts.scheme in uses_relative and bool(parts.netloc)

    def __call__(self, href: str) -> str:
        if not self._by_prefix or not href or "//" in href or not _PLAIN_PATH.fullmatch(href):
            return urljoin(self.base, href)
        prefix = _PATH_PREFIX.match(href).group()
        rest = href[len(prefix):]
        if rest in (".", "..") or rest.startswith(("./", "../")) or "/./" in rest or "/../" in rest \
                or rest.endswith(("/.", "/..")):
            return urljoin(self.base, href)
        resolved = self._prefixes.get(prefix)
        if resolved is None:
            resolved = self._prefixes[prefix] = urljoin(self.base, prefix or "./")
        if not resolved.endswith("/"):  # never for these prefixes; urljoin's answer if it were
            return urljoin(self.base, href)
        return resolved + rest


def _quoted(text: str) -> str:
    """``text`` in quotes as the spec's YAML shows it (a regex's ``\\d`` stays one backslash), in
    the quote mark it does not hold, so reject reasons group by kind
    (:func:`~scrape_assets.validation_report.reason_kind`); ``repr`` when it holds both."""
    if "'" not in text:
        return f"'{text}'"
    return f'"{text}"' if '"' not in text else repr(text)


class _FieldError(ValueError):
    """A card field could not be read; ``str()`` is the reject reason."""


#: Elements a browser starts on a new line: their start and their end separate the text around them.
#: The HTML Standard's block-level rendering (https://html.spec.whatwg.org/multipage/rendering.html,
#: "display: block", list items, table rows and cells) of elements found in page content, plus ``br``.
_BREAKING_TAGS = frozenset({
    "br", "p", "div", "li", "ul", "ol", "dl", "dt", "dd", "menu", "dir", "tr", "td", "th", "table", "caption",
    "h1", "h2", "h3", "h4", "h5", "h6", "hgroup", "section", "article", "aside", "nav", "main", "header", "footer",
    "address", "blockquote", "center", "figure", "figcaption", "pre", "listing", "xmp", "form", "fieldset",
    "legend", "details", "summary", "dialog", "search", "hr",
})
#: Elements whose text a browser does not show (a script's code, a style sheet).
_NOT_SHOWN_TAGS = frozenset({"script", "style", "template"})


def _visible_text(node: LexborNode, *, breaks: bool = True, hidden: frozenset[str] = _NOT_SHOWN_TAGS,
                  add_text: Callable[[list[str], LexborNode], None] | None = None) -> str:
    """``node``'s text as shown: without the text of script, style and template elements (of
    ``hidden``'s) and, with ``breaks``, with a space where a line break or a block element
    starts or ends. ``add_text(parts, text_node)``, when given, appends each text node's text
    to the parts joined at the end (:func:`_price_text`'s checks); it may raise.

    A block element's end counts wherever it is nested: in ``<a><h3>Title</h3></a>Ships`` the
    ``h3`` ends before "Ships" although "Ships" follows the ``a``. The tree is walked once,
    each node entered and left once (linear in the field's size however deep the nesting;
    nodes are told apart by ``mem_id``, their address: selectolax's ``==`` serialises both
    subtrees when they differ).
    """
    if node.tag in hidden:  # a selector matching a script or style element: nothing shown
        return ""
    parts: list[str] = []
    stop = node.mem_id
    current = node.first_child
    while current is not None:
        tag = current.tag
        if tag == "-text":
            if add_text is None:
                parts.append(current.text_content or "")
            else:
                add_text(parts, current)
        elif breaks and tag in _BREAKING_TAGS:
            parts.append(" ")  # where it starts
        child = None if tag in hidden else current.first_child
        if child is not None:
            current = child
            continue
        while True:  # leave ``current``, then each ancestor whose last child it was
            if breaks and current.tag in _BREAKING_TAGS:
                parts.append(" ")  # where it ends: "<p>In stock</p>Ships", "<a><h3>Title</h3></a>Ships"
            following = current.next
            if following is not None:
                current = following
                break
            current = current.parent
            if current is None or current.mem_id == stop:
                current = None
                break
    return "".join(parts)


def _decodable(name: str, value: str, body: bytes, content_type: str | None) -> None:
    """Raise :class:`_FieldError` when ``value`` holds U+FFFD: bytes the page's charset could not
    decode (a wrong charset label), so the text read is not what the site shows."""
    if "\ufffd" in value:
        raise _FieldError(f"{name}: {value!r} has a character the page's charset ({sniff_charset(body, content_type)}) "
                          "cannot decode (U+FFFD); is its charset label wrong?")


#: Not read in a price: struck-through text is the old price ("<del>£20</del> £12"), never the current.
_PRICE_HIDDEN_TAGS = _NOT_SHOWN_TAGS | {"del", "s", "strike"}


def _price_text(node: LexborNode) -> str:
    """A price element's text as shown, inline elements joined ("£<span>51</span>.77" is "£51.77"),
    without struck-through text (``del``, ``s``, ``strike``: "<del>£20</del> £12" is " £12").

    Two digits in a ``<sup>`` right after digits are the cents ("£45<sup>17</sup>": "£45.17";
    a decimal mark is put between, "," when the digits before hold a "." grouping them); digits
    in a ``<sup>`` after a price that has its decimals (and maybe its sign) are a footnote's
    mark, left out ("£12.99<sup>1</sup>", "12,99 €<sup>1</sup>").

    Raises:
        _FieldError: digits of two other elements would run together ("<span>45</span><span>17</span>":
            is "17" the cents, or part of the units?), read as one number they could be wrong.
    """
    return _visible_text(node, breaks=False, hidden=_PRICE_HIDDEN_TAGS, add_text=_add_price_part)


def _add_price_part(parts: list[str], text_node: LexborNode) -> None:
    """Append a price's text node to ``parts`` (see :func:`_price_text`)."""
    part = text_node.text_content or ""
    if not part.lstrip()[:1].isdigit():  # the usual case: nothing to join with the digits before
        parts.append(part)
        return
    text = "".join(parts)
    parent = text_node.parent
    in_sup = parent is not None and parent.tag == "sup" and part.strip().isdigit()
    before = text.rstrip()
    if in_sup and (re.search(r"\d[.,]\d{1,2}$", before)
                   or (_is_sign(before[-1:]) and re.search(r"\d\s*\S$", before))):
        return  # "£12.99<sup>1</sup>", "12,99 €<sup>1</sup>", "99 €<sup>1</sup>": a footnote's mark ("£12.<sup>99</sup>": cents)
    if in_sup and before[-1:].isdigit():
        number = re.search(r"[\d.,' \u00a0]*$", before).group()
        if len(part.strip()) == 2:  # "£45<sup>17</sup>", "12 <sup>99</sup> €": the cents
            parts[:] = [before, "," if "." in number and "," not in number else ".", part.strip()]
            return
    if part[:1].isdigit() and text[-1:].isdigit():
        raise _FieldError(f"price: digits of separate elements run together in {(text + part).strip()!r} "
                          f"({text.split()[-1]!r} then {part.split()[0]!r}): the units and the cents? "
                          "point the spec's price selector at an element holding the whole price")
    parts.append(part)


def _read(
    card: LexborNode, name: str, field: Field_, cache: dict[str, LexborNode | None], *, allow_empty: bool = False
) -> str:
    """Text or attribute of ``field`` inside ``card``, whitespace-collapsed and mojibake-repaired.

    ``cache`` maps CSS selectors to the card's matching node (title and url share one).
    Text fields put a space where a line break or a block element starts or ends ("In
    stock<br>Ships in 2 days" and "<p>In stock</p>Ships in 2 days" are "In stock Ships in 2
    days"; inline markup joins as shown: "H<sub>2</sub>O" is "H2O"). An attribute's
    whitespace is collapsed too (a ``title`` spanning lines), except the url's (stripped only).
    """
    if field.css not in cache:
        cache[field.css] = card.css_first(field.css)
    node = cache[field.css]
    if node is None:
        raise _FieldError(f"{name}: no element matches {field.css!r}")
    if field.attr is None:
        # A price's digits may be split over inline elements ("£<span>51</span>.77"): joined as shown.
        value = " ".join((_price_text(node) if name == "price" else _visible_text(node)).split())
    else:
        raw = node.attributes.get(field.attr)
        if raw is None:
            raise _FieldError(f"{name}: element {field.css!r} has no attribute {field.attr!r}")
        value = raw.strip() if name == "url" else " ".join(raw.split())
    if not value and not allow_empty:
        where = f"attribute {field.attr!r}" if field.attr else "text"
        raise _FieldError(f"{name}: empty {where} in {field.css!r}")
    return repair_text(value)


def _origin(parts) -> tuple[str, str | None, int | None]:
    """``(scheme, host, port)`` of a ``urlsplit`` result as RFC 6454 compares them (host in
    lower case, a default port made explicit). Raises ValueError for a port that is no number.
    The fetcher's ``_origin`` does the same on httpx URLs; the parser does not import httpx
    (parse workers and re-parse backfills never fetch)."""
    scheme = parts.scheme.lower()
    return scheme, parts.hostname, parts.port or DEFAULT_PORTS.get(scheme)


def _canonical(url: str, fetch_base_url: str | None, canonical_base_url: str | None) -> str:
    """``url`` moved from the mirror it was fetched from onto the canonical base URL.

    A URL under ``fetch_base_url`` (same origin, RFC 6454: host case and an explicit default
    port do not matter, as after a redirect; path under the base's) gets that prefix
    replaced by ``canonical_base_url``; any other URL is returned as is.
    """
    if not (fetch_base_url and canonical_base_url):
        return url
    if url.startswith(fetch_base_url):
        return canonical_base_url + url[len(fetch_base_url) :]
    parts, base = urlsplit(url), urlsplit(fetch_base_url)
    try:
        same_origin = _origin(parts) == _origin(base)
    except ValueError:  # a port that is no number
        return url
    if not same_origin or not parts.path.startswith(base.path):
        return url
    rest = parts._replace(scheme="", netloc="", path=parts.path[len(base.path):]).geturl()
    return canonical_base_url + rest


def parse_listing(
    body: bytes,
    spec: SiteSpec,
    page_url: str,
    *,
    canonical_base_url: str | None = None,
    fetch_base_url: str | None = None,
    content_type: str | None = None,
) -> ParsedPage:
    """Parse one listing page into product rows, rejects and pager information.

    The document is parsed once (selectolax, lexbor backend). Each element matching
    ``spec.selectors.product`` is a card; a card missing a field, or whose price, rating or
    product id cannot be read, becomes a :class:`Reject` rather than an exception or a row
    with nulls. A page without cards returns no products (deciding whether that is an error
    is the caller's layout guard, see ``schemas.PagesSchema``).

    URLs: a product URL is ``urljoin(base, href)``, ``base`` the page's first ``<base href>``
    (resolved against ``page_url``) or else ``page_url``; the ``next`` link resolves against
    that base only when it is on ``page_url``'s origin. When the page was fetched from a mirror,
    pass both ``fetch_base_url`` (where it was fetched, e.g. ``"http://127.0.0.1:8123/"``) and
    ``canonical_base_url`` (usually ``spec.base_url``): a product URL starting with
    ``fetch_base_url`` gets that prefix replaced, so rows name the real site. With only one of
    them, URLs are left as resolved. ``pager.next_url`` is never rewritten (it is for fetching).
    ``product_id`` is group 1 of ``spec.product_id.regex`` searched in the final product URL.

    Args:
        body: the raw response body.
        spec: the site spec (selectors, pagination, product id rule, default currency).
        page_url: absolute URL the page was fetched from.
        canonical_base_url: base URL product URLs should carry; see above.
        fetch_base_url: base URL the page was actually fetched from; see above.
        content_type: the response's ``Content-Type`` header, for the charset.

    Returns:
        The :class:`ParsedPage`; ``products`` keep page order.
    """
    tree = LexborHTMLParser(_decode(body, content_type))
    selectors = spec.selectors
    id_pattern = _compiled(spec.product_id.regex)
    products: list[dict] = []
    rejects: list[Reject] = []
    cards = tree.css(selectors.product)
    base = _document_base(tree, page_url)
    join = UrlJoiner(base)
    for card in cards:
        nodes: dict[str, LexborNode | None] = {}
        url = product_id = None
        try:
            href = _read(card, "url", selectors.url, nodes)
            try:
                url = _canonical(join(href), fetch_base_url, canonical_base_url)
            except ValueError as exc:  # "http://[bad/": urlsplit refuses it
                raise _FieldError(f"url: {href!r} cannot be resolved against the page ({exc})") from None
            match = id_pattern.search(url)
            if match is None or not match.group(1):
                hint = ("" if selectors.url.attr else
                        " (selectors.url has no attr, so the link's text was read: attr: href?)")
                raise _FieldError(f"product_id: {_quoted(spec.product_id.regex)} does not match {url!r}{hint}")
            if len(match.group(1)) > MAX_PRODUCT_ID_CHARS:
                raise _FieldError(f"product_id: {len(match.group(1))} characters in {url!r}; the warehouse keeps "
                                  f"at most {MAX_PRODUCT_ID_CHARS}")
            product_id = match.group(1)
            title = _read(card, "title", selectors.title, nodes)
            price_text = _read(card, "price", selectors.price, nodes, allow_empty=True)
            rating_text = _read(card, "rating", selectors.rating, nodes)
            # The lost character may have been the currency symbol, or a letter of the title.
            _decodable("title", title, body, content_type)
            _decodable("price", price_text, body, content_type)
            try:
                price, currency = parse_price(price_text, spec.currency, decimal_mark=spec.decimal_mark)
            except ValueError as exc:
                raise _FieldError(f"price: {exc}") from None
            if price <= 0:
                raise _FieldError(f"price: {price} in {price_text!r} is not above zero")
            if not price_fits(price):
                raise _FieldError(f"price: {price} in {price_text!r} does not fit the warehouse's NUMERIC"
                                  f"({PRICE_PRECISION}, {PRICE_SCALE}) (below 10^{PRICE_PRECISION - PRICE_SCALE}, "
                                  f"whole cents)")
            try:
                rating = parse_rating(rating_text)
            except ValueError as exc:
                raise _FieldError(f"rating: {exc}") from None
            availability = _read(card, "availability", selectors.availability, nodes)
            _decodable("availability", availability, body, content_type)
        except _FieldError as exc:
            rejects.append(Reject(url=url or page_url, reason=str(exc), product_id=product_id))
            continue
        products.append(
            {
                "product_id": product_id,
                "title": title,
                "price": price,
                "currency": currency,
                "rating": rating,
                "availability": availability,
                "url": url,
            }
        )
    return ParsedPage(
        products=products, rejects=rejects, cards_found=len(cards), pager=parse_pager(tree, spec, page_url, base=base),
    )
