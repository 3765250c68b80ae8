"""Alerts: a log line always, and a JSON POST to a webhook when one is configured.

The payload is Slack-compatible (``{"text": ...}``) plus structured fields. The webhook
URL is a secret: it is never logged or put in metadata; delivery errors are logged
with the URL redacted and never fail the caller (an alert must not break a sensor).
"""

from __future__ import annotations

import json
import logging

from scrape_assets.storage import redact_url

logger = logging.getLogger(__name__)


#: Outcomes of :func:`deliver_alert`.
SENT, REFUSED_FOR_GOOD, NOT_DELIVERED = "sent", "refused for good", "not delivered"
#: Answers that refuse the message itself (malformed, too large, unprocessable: a chat hook's
#: length limit): sending it again changes nothing. Any other failure may pass (a revoked or
#: mistyped URL's 401/403/404/410 once the URL is fixed, a 5xx, a timeout): kept, tried again.
_MESSAGE_REFUSED = frozenset({400, 413, 422})


def send_alert(text: str, *, webhook_url: str | None, fields: dict | None = None, timeout_s: float = 10.0) -> bool:
    """Log ``text`` at WARNING and POST it to ``webhook_url`` if set.

    Args:
        text: one human-readable line.
        webhook_url: where to POST ``{"text": text, **fields}``; ``None`` logs only.
        fields: extra JSON-serialisable fields (category, success_rate, ...).
        timeout_s: httpx's timeout, per connect, read and write.

    Returns:
        True when the webhook accepted it (2xx), False when it was not sent or failed. The body
        is UTF-8 JSON; a character UTF-8 cannot carry (a lone surrogate) is sent as ``?``.
    """
    return deliver_alert(text, webhook_url=webhook_url, fields=fields, timeout_s=timeout_s) == SENT


def deliver_alert(text: str, *, webhook_url: str | None, fields: dict | None = None, timeout_s: float = 10.0) -> str:
    """:func:`send_alert`, telling why an alert was not taken: :data:`SENT` (2xx),
    :data:`REFUSED_FOR_GOOD` (400, 413 or 422: the webhook rejects this message itself, too
    long for it say; sending it again changes nothing), :data:`NOT_DELIVERED` (no webhook,
    unreachable, or any other answer: a URL revoked or mistyped until it is fixed, a 5xx;
    it may pass)."""
    logger.warning("ALERT: %s", text)
    if not webhook_url:
        return NOT_DELIVERED
    import httpx  # here: sensors that send no alert never import the HTTP stack

    # Encoded here, not by httpx (strict UTF-8): a lone surrogate (a file name's undecodable
    # byte in an error message, say) is sent as "?" instead of raising UnicodeEncodeError.
    body = json.dumps({"text": text, **(fields or {})}, ensure_ascii=False).encode("utf-8", errors="replace")
    # Scheme, host and port only; a URL without "://" (a typo such as "https//hooks...") has no
    # host redact_url could tell from its secret path, so none of it is shown.
    shown = redact_url(webhook_url, keep_path=False) if "://" in webhook_url else "(not shown: no scheme://)"
    try:
        response = httpx.post(webhook_url, content=body, headers={"Content-Type": "application/json"},
                              timeout=timeout_s)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL is no HTTPError ("https://h:44a/", a "\r")
        logger.error("alert webhook %s unreachable: %s", shown, type(exc).__name__)
        return NOT_DELIVERED
    if response.is_success:
        return SENT
    logger.error("alert webhook %s answered HTTP %s", shown, response.status_code)
    status = response.status_code
    return REFUSED_FOR_GOOD if status in _MESSAGE_REFUSED else NOT_DELIVERED
