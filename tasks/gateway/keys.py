"""API keys of the gateway: their syntax, where they are configured, and how they are kept (digests only).

Each entry is ``KEY`` (an operator's key) or ``KEY:MODEL|MODEL|...`` (only these models), separated by commas in
``SWAPLESS_API_KEYS``, one per line in ``SWAPLESS_API_KEYS_FILE`` (``#`` starts a comment).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass

from swapless.config.errors import ConfigError
from swapless.config.settings import GatewaySettings
from swapless.manager.registry.store import ModelStore

__all__ = ["MAX_KEY_CHARS", "MIN_KEY_CHARS", "KeyEntry", "KeyRing", "KeyRule", "load_keys", "parse_keys"]

MIN_KEY_CHARS = 16
MAX_KEY_CHARS = 512
_KEY_CHARS = re.compile(r"[A-Za-z0-9._~+/-]+=*")
_HOW_TO_MAKE = "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"


@dataclass(frozen=True)
class KeyEntry:
    """One entry as written: its key's digest, the models it names (None: every model), and where it was written."""

    digest: bytes
    models: tuple[str, ...] | None
    where: str


@dataclass(frozen=True)
class KeyRule:
    """One accepted key: the SHA-256 digest of the key and the canonical ids it may call (None: every model)."""

    digest: bytes
    models: frozenset[str] | None
    #: the names as written, for messages
    names: tuple[str, ...] = ()

    @property
    def owner(self) -> str:
        """What the gateway records as the submitter of this key's jobs: a prefix of the key's digest, never the key."""
        return "key:" + self.digest.hex()[:32]

    def allows(self, store: ModelStore, model: str) -> bool:
        """Whether this key may call ``model`` (an id, alias or route; an unknown name is refused)."""
        if self.models is None:
            return True
        if store.is_route(model):
            return model in self.models
        return model in store and store.resolve(model) in self.models


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape") if isinstance(key, str) else key).digest()


def parse_keys(text: str, source: str, *, per_line: bool) -> list[KeyEntry]:
    """The entries of ``SWAPLESS_API_KEYS`` or of a keys file (``per_line``).

    Raises:
        ConfigError: an entry is malformed; the message names the entry (never the key).
    """
    if per_line:
        raw = [(f"{source} line {n}", line.split("#", 1)[0].strip()) for n, line in enumerate(text.splitlines(), 1)]
    else:
        raw = [(f"{source} entry {n}", part.strip()) for n, part in enumerate(text.split(","), 1)]
    entries = []
    for where, entry in raw:
        if not entry:
            continue
        key, colon, names = entry.partition(":")
        key = key.strip()
        if not _KEY_CHARS.fullmatch(key):
            raise ConfigError(where, "an API key holds only letters, digits and - . _ ~ + / (= at the end), with no "
                              f"spaces; write KEY or KEY:MODEL|MODEL; {_HOW_TO_MAKE}")
        if not MIN_KEY_CHARS <= len(key) <= MAX_KEY_CHARS:
            raise ConfigError(where, f"the key is {len(key)} characters; use {MIN_KEY_CHARS} to {MAX_KEY_CHARS}: "
                              f"{_HOW_TO_MAKE}")
        models = None
        if colon:
            models = tuple(name.strip() for name in names.split("|"))
            if not all(models):
                raise ConfigError(where, "after the ':' name the models the key may call, separated by |, like "
                                  "KEY:sentiment|spam (or drop the ':' for every model)")
        entries.append(KeyEntry(_digest(key), models, where))
    return entries


def load_keys(settings: GatewaySettings, store: ModelStore) -> list[KeyRule]:
    """The keys of ``SWAPLESS_API_KEYS`` and ``SWAPLESS_API_KEYS_FILE``, hashed, their models resolved; empty: none.

    Raises:
        ConfigError: an entry is malformed, names an unknown model or repeats a key; the file is unusable.
    """
    entries: list[KeyEntry] = []
    if settings.api_keys is not None and settings.api_keys.get_secret_value().strip():
        entries += parse_keys(settings.api_keys.get_secret_value(), "SWAPLESS_API_KEYS", per_line=False)
        if not entries:
            raise ConfigError("SWAPLESS_API_KEYS", "it lists no key: write KEY or KEY:MODEL|MODEL, comma-separated, "
                              "or unset it")
    if settings.api_keys_file is not None:
        path = settings.api_keys_file
        try:
            text = path.read_text(encoding="utf-8-sig")  # a BOM (Windows editors) is not part of the first key
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else type(err).__name__
            raise ConfigError("SWAPLESS_API_KEYS_FILE", f"cannot read {path} ({reason}): point it at a readable "
                              "UTF-8 file of keys, one per line") from None
        from_file = parse_keys(text, str(path), per_line=True)
        if not from_file:
            raise ConfigError("SWAPLESS_API_KEYS_FILE", f"{path} lists no key: write one KEY or KEY:MODEL|MODEL per "
                              "line, or unset the variable")
        entries += from_file
    rules: list[KeyRule] = []
    first: dict[bytes, str] = {}
    for entry in entries:
        if entry.digest in first:
            raise ConfigError(entry.where, f"the same key as {first[entry.digest]}: list each key once")
        first[entry.digest] = entry.where
        models = None
        if entry.models is not None:
            resolved = set()
            for name in entry.models:
                try:
                    resolved.add(name if store.is_route(name) else store.resolve(name))
                except KeyError as err:  # UnknownModel: its message lists the known ids
                    raise ConfigError(entry.where, f"{err}; name models of the models file") from None
            models = frozenset(resolved)
        rules.append(KeyRule(entry.digest, models, entry.models or ()))
    return rules


class KeyRing:
    """The accepted keys (``load_keys``), matched in constant time."""

    def __init__(self, rules: Iterable[KeyRule]) -> None:
        self.rules = tuple(rules)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def match(self, key: str | bytes) -> KeyRule | None:
        """The rule of ``key``, comparing its digest with every rule's in constant time; None when none matches."""
        digest = _digest(key)
        found = None
        for rule in self.rules:  # no early exit: the time does not depend on which rule matches
            if hmac.compare_digest(digest, rule.digest):
                found = rule
        return found
