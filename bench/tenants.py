"""One tenant against the others on the batch API: what a hostile key's uploads and batches cost the gateway's memory
and Redis, and the other key's listings, with the default limits.

    python -m bench.tenants            # writes bench/TENANTS.md (a few minutes on 2 cores)
    python -m bench.tenants --quick    # smaller floods, 1 repetition; writes bench/out/TENANTS-quick.md

A real ``swapless serve`` (its batch runner off, so that what is measured is what the API keeps, not the jobs a
runner would queue) on the local Redis under a fresh prefix, files in a fresh directory, two API keys limited to one
model: the attacker's and the tenant's. Each repetition, in order, from this process over loopback (httpx):

1. **metadata**: 5 ``POST /v1/batches`` with 16 metadata values of 1 MiB each (OpenAI allows 512 characters);
2. **form fields**: one ``POST /v1/files`` whose body is 150 MiB of distinct form fields of 1 KiB before the file;
3. **files**: the attacker uploads 3,000 one-line files as fast as it can (``--quick``: 1,200);
4. **batches**: the attacker creates 200 batches over one of its files (``--quick``: 60);
5. the tenant's ``GET /v1/files`` and ``GET /v1/batches`` (median of 10), before 1. and after 4.

Measured: the answers' statuses, Redis's ``used_memory`` and the gateway's RSS (psutil) before and after each step,
and the bytes of files kept on disk. The bounds judged are stated in ``BOUNDS``; they follow from the settings'
defaults (``SWAPLESS_BATCH_MAX_FILES_PER_KEY`` 1,000, ``..._ACTIVE_PER_KEY`` 20, OpenAI's metadata limits, 8
multipart parts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import redis

from bench.common import OUT, REPO, Process, cleanup, fresh_prefix, python, summary

__all__ = ["main"]

ATTACKER = "attacker-key-" + "a" * 24
TENANT = "tenant-key-" + "t" * 24
MODEL = "spam"
MIB = 1024 * 1024

#: (row, bound, at most?): what the default limits promise.
BOUNDS = [
    ("metadata: Redis growth (MiB)", 1.0, True),
    ("form fields: gateway RSS growth (MiB)", 32.0, True),
    ("files: accepted", 1000, True),
    ("batches: accepted", 20, True),
    ("all steps: Redis growth (MiB)", 8.0, True),
    ("tenant GET /v1/files after / before", 3.0, True),
    ("tenant GET /v1/batches after / before", 3.0, True),
]


def _line(i: int) -> bytes:
    return json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/predict",
                       "body": {"model_id": MODEL, "input": "x"}}).encode() + b"\n"


def _median_ms(http: httpx.Client, path: str, calls: int = 10) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        assert http.get(path).status_code == 200
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _many_fields_body(boundary: str, total_bytes: int) -> bytes:
    parts = []
    field = b"z" * 1024
    for i in range(total_bytes // 1024):
        head = f"--{boundary}\r\nContent-Disposition: form-data; name=\"f{i}\"\r\n\r\n".encode()
        parts.append(head + field + b"\r\n")
    parts.append(f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n".encode())
    parts.append(f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
                 "Content-Type: application/jsonl\r\n\r\n".encode() + _line(0) + f"\r\n--{boundary}--\r\n".encode())
    return b"".join(parts)


def _flood_files(attacker: httpx.Client, used: Callable[[], float], files_n: int, found: dict[str, float]) -> None:
    """The attacker uploads ``files_n`` more files: how many were taken, refused, and what Redis grew by."""
    before, started = used(), time.perf_counter()
    accepted = refused = 0
    for i in range(files_n):
        status = attacker.post("/v1/files", data={"purpose": "batch"},
                               files={"file": (f"f{i}.jsonl", _line(i), "application/jsonl")}).status_code
        accepted += status == 200
        refused += status in (413, 429)
    found["files: accepted"] = accepted + 1  # with its first one
    found["files: refused 429"] = refused
    found["files: seconds"] = time.perf_counter() - started
    found["files: Redis growth (MiB)"] = used() - before


def _flood_batches(attacker: httpx.Client, used: Callable[[], float], own: str, batches_n: int,
                   found: dict[str, float]) -> None:
    """The attacker creates ``batches_n`` batches of its file: how many were taken, refused, what Redis grew by."""
    before = used()
    accepted = refused = 0
    for _ in range(batches_n):
        status = attacker.post("/v1/batches", json={"input_file_id": own, "endpoint": "/predict",
                                                    "completion_window": "1h"}).status_code
        accepted += status == 200
        refused += status == 429
    found["batches: accepted"] = accepted
    found["batches: refused 429"] = refused
    found["batches: Redis growth (MiB)"] = used() - before


def _attack(attacker: httpx.Client, used: Callable[[], float], rss: psutil.Process, files_n: int, batches_n: int,
            found: dict[str, float]) -> None:
    """Oversized metadata, a form of many fields, then floods of files and batches."""
    own = attacker.post("/v1/files", data={"purpose": "batch"},
                        files={"file": ("a.jsonl", _line(0), "application/jsonl")}).json()["id"]
    before = used()
    statuses = [attacker.post("/v1/batches", json={
        "input_file_id": own, "endpoint": "/predict", "completion_window": "1h",
        "metadata": {f"k{i}": "v" * MIB for i in range(16)}}).status_code for _ in range(5)]
    found["metadata: refused (of 5)"] = sum(1 for status in statuses if status == 400)
    found["metadata: Redis growth (MiB)"] = used() - before

    rss_before = rss.memory_info().rss / MIB
    boundary = "b0undary"
    answer = attacker.post("/v1/files", content=_many_fields_body(boundary, 150 * MIB),
                           headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    found["form fields: status"] = answer.status_code
    found["form fields: gateway RSS growth (MiB)"] = rss.memory_info().rss / MIB - rss_before
    _flood_files(attacker, used, files_n, found)
    _flood_batches(attacker, used, own, batches_n, found)


def repetition(redis_url: str, files_n: int, batches_n: int) -> dict[str, float]:
    prefix = fresh_prefix("tenants")
    client = redis.Redis.from_url(redis_url)
    port = 19000 + int(time.time() * 1000) % 1000
    found: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as workdir:
        env = {"SWAPLESS_REDIS_URL": redis_url, "SWAPLESS_KEY_PREFIX": prefix, "SWAPLESS_QUEUE": prefix + "jobs",
               "SWAPLESS_API_KEYS": f"{ATTACKER}:{MODEL},{TENANT}:{MODEL}", "SWAPLESS_BATCH_RUNNER": "false",
               "SWAPLESS_BATCH_FILES_URL": str(Path(workdir) / "files")}
        gateway = Process([python(), "-m", "swapless", "serve", "--port", str(port), "--log-level", "warning"], env,
                          OUT / "tenants" / f"gateway-{prefix.rstrip(':')}.log")
        base = f"http://127.0.0.1:{port}"
        attacker = httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {ATTACKER}"})
        tenant = httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {TENANT}"})
        try:
            gateway.wait_http(tenant)
            rss = psutil.Process(gateway.proc.pid)

            def used() -> float:
                return float(client.info("memory")["used_memory"]) / MIB  # type: ignore[index]

            mine = tenant.post("/v1/files", data={"purpose": "batch"},
                               files={"file": ("t.jsonl", _line(0), "application/jsonl")}).json()["id"]
            tenant.post("/v1/batches", json={"input_file_id": mine, "endpoint": "/predict", "completion_window": "1h"})
            found["tenant GET /v1/files before (ms)"] = _median_ms(tenant, "/v1/files")
            found["tenant GET /v1/batches before (ms)"] = _median_ms(tenant, "/v1/batches")
            start_mem = used()
            _attack(attacker, used, rss, files_n, batches_n, found)
            found["all steps: Redis growth (MiB)"] = used() - start_mem
            found["tenant GET /v1/files after (ms)"] = _median_ms(tenant, "/v1/files")
            found["tenant GET /v1/batches after (ms)"] = _median_ms(tenant, "/v1/batches")
            found["tenant GET /v1/files after / before"] = (found["tenant GET /v1/files after (ms)"]
                                                            / found["tenant GET /v1/files before (ms)"])
            found["tenant GET /v1/batches after / before"] = (found["tenant GET /v1/batches after (ms)"]
                                                              / found["tenant GET /v1/batches before (ms)"])
            found["gateway RSS at the end (MiB)"] = rss.memory_info().rss / MIB
            found["files kept on disk (MiB)"] = sum(p.stat().st_size for p in Path(workdir).rglob("*")
                                                    if p.is_file()) / MIB
        finally:
            attacker.close()
            tenant.close()
            gateway.stop()
            cleanup(client, prefix)
            client.close()
    return found


def render(rows: dict[str, list[float]], command: str, repeats: int) -> str:
    lines = [
        "# One tenant against the others (batch API)",
        "",
        (f"Command: `{command}` on this machine (2 cores, CPU only, shared); {repeats} repetition(s), median "
         "[min–max]. A `swapless serve` with its default limits (batch runner off), two API keys limited to one "
         "model; the attacker floods, the tenant lists (see the module docstring of `bench/tenants.py`)."),
        "",
        "| measurement | bound | median [min–max] | within? |",
        "|---|---|---|---|",
    ]
    bounds = {name: (bound, at_most) for name, bound, at_most in BOUNDS}
    for name, values in rows.items():
        if name in bounds:
            bound, at_most = bounds[name]
            value = statistics.median(values)
            within = "yes" if (value <= bound if at_most else value >= bound) else "**NO**"
            lines.append(f"| {name} | {'≤' if at_most else '≥'} {bound:g} | {summary(values)} | {within} |")
        else:
            lines.append(f"| {name} | - | {summary(values)} | - |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--repeats", type=int, default=None, help="default 3, --quick 1")
    parser.add_argument("--quick", action="store_true", help="smaller floods, 1 repetition")
    parser.add_argument("--write", type=Path, default=None, help="default bench/TENANTS.md, --quick bench/out/...")
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    files_n, batches_n = (1200, 60) if args.quick else (3000, 200)
    rows: dict[str, list[float]] = {}
    for rep in range(repeats):
        print(f"repetition {rep + 1}/{repeats}", flush=True)
        for name, value in repetition(args.redis_url, files_n, batches_n).items():
            rows.setdefault(name, []).append(value)
            print(f"  {name}: {value:.4g}", flush=True)
    table = render(rows, "python -m bench.tenants" + (" --quick" if args.quick else ""), repeats)
    print(table)
    write = args.write or (OUT / "TENANTS-quick.md" if args.quick else REPO / "bench" / "TENANTS.md")
    write.parent.mkdir(parents=True, exist_ok=True)
    write.write_text(table)
    print(f"written to {write}")


if __name__ == "__main__":
    main()
