"""Which targets a webhook's ``callback_url`` may name, and the one address a sender connects to."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from swapless.config.errors import WebhookRefused

__all__ = ["allowed_hosts", "check_target", "connect_address", "pinned", "resolve_host"]


def allowed_hosts(setting: str) -> frozenset[str]:
    """The hosts of ``SWAPLESS_WEBHOOK_ALLOWED_HOSTS`` (comma-separated), lower case."""
    return frozenset(h.strip().lower().strip("[]") for h in setting.split(",") if h.strip())


def _listed(host: str, allowed: frozenset[str]) -> bool:
    return host in allowed or any(a.startswith("*.") and host.endswith(a[1:]) for a in allowed)


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_loopback or ip.is_link_local)


def check_target(
    url: str, allowed: frozenset[str], resolve: Callable[[str], Sequence[str]] | None = None
) -> str:
    """Check that ``url`` may be called back; returns its host.

    Args:
        allowed: ``allowed_hosts(SWAPLESS_WEBHOOK_ALLOWED_HOSTS)``.
        resolve: host -> its addresses; None: check only what needs no lookup, as producers do.

    Raises:
        WebhookRefused: not http(s), no host, a bad port, a host off the allow-list, or an address not public.
    """
    if not isinstance(url, str) or len(url) > 2048:
        raise WebhookRefused(str(url)[:100], "it must be an http or https URL of at most 2048 characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookRefused(url, "it must be an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise WebhookRefused(url, "it must not carry a user or password (the signature authenticates the sender)")
    try:
        parts.port  # noqa: B018 - raises for a port that is not a number from 0 to 65535
    except ValueError:
        raise WebhookRefused(url, "its port must be a number from 1 to 65535") from None
    if parts.port == 0:
        raise WebhookRefused(url, "its port must be a number from 1 to 65535")
    host = parts.hostname.lower()
    if allowed:
        if not _listed(host, allowed):
            raise WebhookRefused(url, f"host {host!r} is not in SWAPLESS_WEBHOOK_ALLOWED_HOSTS; add it there")
        return host
    if host == "localhost" or host.endswith(".localhost"):
        raise WebhookRefused(url, "it names this machine; list the host in SWAPLESS_WEBHOOK_ALLOWED_HOSTS to allow it")
    try:
        addresses: Sequence[str] = [str(ipaddress.ip_address(host))]
    except ValueError:
        if resolve is None:
            return host
        try:
            addresses = resolve(host)
        except OSError as err:
            raise WebhookRefused(url, f"host {host!r} does not resolve ({err})") from None
    _refuse_internal(url, host, addresses)
    return host


def _refuse_internal(url: str, host: str, addresses: Sequence[str]) -> None:
    private = [a for a in addresses if not _public(a)]
    if private:
        raise WebhookRefused(url, f"host {host!r} is at an internal address ({private[0]}); list the host in "
                                  "SWAPLESS_WEBHOOK_ALLOWED_HOSTS to allow it")


def connect_address(url: str, allowed: frozenset[str], resolve: Callable[[str], Sequence[str]]) -> str:
    """The one address a sender connects to for ``url``, checked as ``check_target`` checks it (no DNS rebinding).

    Raises:
        WebhookRefused: as ``check_target``.
        OSError: the host does not resolve now.
    """
    host = check_target(url, allowed)  # what needs no lookup: scheme, user, allow-list, literal and local names
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    addresses = list(resolve(host))
    if not addresses:
        raise OSError(f"host {host!r} has no address")
    if not allowed:
        _refuse_internal(url, host, addresses)
    return addresses[0]


def pinned(url: str, address: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    """``url`` sent to ``address``: the URL to connect to, its ``Host`` header and the TLS server name."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        ipaddress.ip_address(host)
        return url, {}, {}  # a literal address needs no pinning
    except ValueError:
        pass
    at = f"[{address}]" if ":" in address else address
    netloc = f"{at}:{parts.port}" if parts.port is not None else at
    return urlunsplit(parts._replace(netloc=netloc)), {"Host": parts.netloc}, {"sni_hostname": host}


def resolve_host(host: str) -> list[str]:
    """Every address ``host`` resolves to (the sender's lookup for ``check_target``)."""
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})
