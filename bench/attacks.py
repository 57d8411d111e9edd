"""Hostile callers of a gateway, for ``bench.gateway``: one process, each attack a bounded loop of its own.

    python -m bench.attacks --port 8000 --key KEY --model sim --duration 20 --out attacks.json

Attacks (every loop stops at the deadline; every connection is to 127.0.0.1):

- ``smuggle``: ``Content-Length: 20`` with ``Transfer-Encoding: chunked``, then chunks of 64 KiB until refused;
- ``bomb``: a gzip body of a few KiB declaring two million BYTES elements on ``/v2`` infer;
- ``flood``: back-to-back ``POST /jobs`` from one key (its accepted job ids are written out: none may be lost);
- ``deletes``: ``DELETE /jobs/<random id>``;
- ``slow``: connections that send a body one byte at a time (held open until the gateway gives up on them);
- ``unauthenticated``: a 30 MiB body declared with no key;
- ``nested``: deeply nested JSON on ``/v2`` infer and ``/jobs``;
- ``oversized``: a 30 MiB text for a text model (refused by its size limit, after the body is read).

Writes ``{attack: {status: count}}`` and the flood's accepted ids as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import struct
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

__all__ = ["main"]


async def _status_of(reader: asyncio.StreamReader) -> str:
    try:
        line = await asyncio.wait_for(reader.readline(), 35)
    except (TimeoutError, ConnectionError):
        return "no answer"
    parts = line.split()
    return parts[1].decode() if len(parts) > 1 else "closed"


async def smuggle(port: int, key: str, deadline: float, seen: Counter[str]) -> None:
    head = (f"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json"
            "\r\nContent-Length: 20\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    chunk = b"10000\r\n" + b"a" * 0x10000 + b"\r\n"
    while time.monotonic() < deadline:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head)
            for _ in range(512):  # 32 MiB at most
                writer.write(chunk)
                await writer.drain()
                if reader.at_eof() or reader._buffer:  # type: ignore[attr-defined]  # an answer came
                    break
            seen[await _status_of(reader)] += 1
        except ConnectionError:
            seen["closed"] += 1
        finally:
            writer.close()


async def slow(port: int, key: str, deadline: float, seen: Counter[str]) -> None:
    head = (f"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json"
            "\r\nContent-Length: 100000\r\n\r\n").encode()
    while time.monotonic() < deadline:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head)
            while time.monotonic() < deadline and not reader.at_eof() and not reader._buffer:  # type: ignore[attr-defined]
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(0.5)
            if reader.at_eof() or reader._buffer:  # type: ignore[attr-defined]
                seen[await _status_of(reader)] += 1
            else:
                seen["held to the end"] += 1
        except ConnectionError:
            seen["closed"] += 1
        finally:
            writer.close()


async def unauthenticated(port: int, deadline: float, seen: Counter[str]) -> None:
    head = (b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 31457280\r\n\r\n")
    while time.monotonic() < deadline:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head + b"a" * 65536)
            await writer.drain()
            seen[await _status_of(reader)] += 1
        except ConnectionError:
            seen["closed"] += 1
        finally:
            writer.close()


async def _loop(client: httpx.AsyncClient, deadline: float, seen: Counter[str], method: str, path: str,
                accepted: list[str] | None = None, **kwargs: Any) -> None:
    while time.monotonic() < deadline:
        try:
            answer = await client.request(method, path.replace("{id}", str(uuid.uuid4())), **kwargs)
        except httpx.HTTPError as err:
            seen[type(err).__name__] += 1
            continue
        seen[str(answer.status_code)] += 1
        if accepted is not None and answer.status_code == 202:
            accepted.append(answer.json()["job_id"])
        if answer.status_code == 429:
            await asyncio.sleep(0.01)  # a client that reads Retry-After would wait longer; this one barely does


def _bomb() -> tuple[bytes, str]:
    inputs = [
        {"name": "TEXT", "datatype": "BYTES", "shape": [2_000_000], "parameters": {"binary_data_size": 8_000_000}}
    ]
    header = json.dumps({"inputs": inputs}).encode()
    return gzip.compress(header + struct.pack("<I", 0) * 2_000_000), str(len(header))


ATTACKS = ("smuggle", "bomb", "flood", "deletes", "slow", "unauthenticated", "nested", "oversized")


async def attack(port: int, key: str, model: str, duration_s: float,
                 only: tuple[str, ...] = ATTACKS, own_keys: bool = False) -> dict[str, Any]:
    """Run the attacks ``only`` names (all by default) for ``duration_s``; returns the statuses seen per attack and
    the flood's accepted ids. ``own_keys``: each attack uses a key of its own, ``<key>-<attack>`` (so that no attack
    is held back by another one's turns at the gateway); else all use ``key``."""
    deadline = time.monotonic() + duration_s
    seen: dict[str, Counter[str]] = {name: Counter() for name in ATTACKS}
    accepted: list[str] = []

    def key_of(name: str) -> str:
        return f"{key}-{name}" if own_keys else key

    def auth(name: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key_of(name)}", **extra}

    bomb, header_length = _bomb()
    nested = b"[" * 50_000 + b"]" * 50_000
    oversized = json.dumps({"model_id": model, "input": "x" * (30 * 1024 * 1024)}).encode()
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60, limits=limits) as client:
        loops = {
            "smuggle": [smuggle(port, key_of("smuggle"), deadline, seen["smuggle"]) for _ in range(2)],
            "bomb": [_loop(client, deadline, seen["bomb"], "POST", f"/v2/models/{model}/infer", content=bomb,
                           headers=auth("bomb", **{"Content-Encoding": "gzip",
                                                   "Inference-Header-Content-Length": header_length}))
                     for _ in range(2)],
            "flood": [_loop(client, deadline, seen["flood"], "POST", "/jobs", accepted, headers=auth("flood"),
                            json={"model_id": model, "input": "flood"}) for _ in range(4)],
            "deletes": [_loop(client, deadline, seen["deletes"], "DELETE", "/jobs/{id}", headers=auth("deletes"))
                        for _ in range(2)],
            "slow": [slow(port, key_of("slow"), deadline, seen["slow"]) for _ in range(100)],
            "unauthenticated": [unauthenticated(port, deadline, seen["unauthenticated"]) for _ in range(2)],
            "nested": [_loop(client, deadline, seen["nested"], "POST", f"/v2/models/{model}/infer", content=nested,
                             headers=auth("nested"))],
            "oversized": [_loop(client, deadline, seen["oversized"], "POST", "/jobs", content=oversized,
                                headers=auth("oversized", **{"Content-Type": "application/json"}))],
        }
        for name, coroutines in loops.items():
            if name not in only:
                for coroutine in coroutines:
                    coroutine.close()
        await asyncio.gather(*(c for name in only for c in loops[name]))
    return {"seen": {name: dict(seen[name]) for name in only}, "accepted": accepted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--own-keys", action="store_true", help="each attack uses its own key, <key>-<attack>")
    parser.add_argument("--model", required=True)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", default=",".join(ATTACKS), help=f"comma-separated, of: {', '.join(ATTACKS)}")
    args = parser.parse_args()
    only = tuple(name.strip() for name in args.only.split(",") if name.strip())
    if unknown := set(only) - set(ATTACKS):
        parser.error(f"unknown attacks {sorted(unknown)}: choose from {', '.join(ATTACKS)}")
    result = asyncio.run(attack(args.port, args.key, args.model, args.duration, only, args.own_keys))
    args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
