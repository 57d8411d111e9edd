"""``python -m bench.device --quick``: runs end to end against a real worker on the simulated device and writes every
row of its table, each marked simulated; it never writes the committed ``bench/DEVICE.md``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEVICE_MD = REPO / "bench" / "DEVICE.md"

ROWS = [
    "device limit (jobs/s)",
    "one pass of 64 (ms)",
    "send_task alone (jobs/s)",
    "stream, submit_jobs (jobs/s)",
    "stream, submit_jobs: vs limit",
    "stream, submit_jobs: worker CPU (ms/job)",
    "stream, send_task (jobs/s)",
    "stream, send_task: vs min(limit, send_task alone)",
    "stream, send_task: worker CPU (ms/job)",
    "lone job, zero-cost model: p50 (ms)",
    "interactive during bulk: p50 in passes",
]


@pytest.mark.slow
def test_quick_mode_runs_and_writes_every_row(redis_url: str, tmp_path: Path) -> None:
    committed = DEVICE_MD.read_text() if DEVICE_MD.exists() else None
    target = tmp_path / "DEVICE-quick.md"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "bench.device", "--quick", "--redis-url", redis_url, "--write",
                           str(target)], cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    text = target.read_text()
    assert text in done.stdout  # the table printed is the one written
    assert "**Every row is simulated**" in text
    cells = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in text.splitlines()
             if line.startswith("| ") and not line.startswith("| measurement")}
    for row in ROWS:
        assert row in cells, f"no row {row!r} in:\n{text}"
        assert float(cells[row].split()[0]) > 0, (row, cells[row])
    assert "Targets (medians):" in text
    assert (DEVICE_MD.read_text() if DEVICE_MD.exists() else None) == committed
