"""Redis URLs as they may be shown: ``redact`` (no password ever printed or logged). Kept apart so that both the
connection helpers and the Sentinel options use it without importing each other."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact"]


def redact(url: str) -> str:
    """``url`` with its password (and ACL user's password) replaced by ``***``: safe to print and log (each
    sentinel's of a ``sentinel://...;sentinel://...`` URL)."""
    if ";" in url:
        return ";".join(redact(part) for part in url.split(";"))
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unreadable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
