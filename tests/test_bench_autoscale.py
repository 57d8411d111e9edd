"""``python -m bench.autoscale --quick``: a short simulated day end to end, the autoscaled fleet only. A controller
follows a real ``swapless exporter``'s ``swapless_workers_desired``: it grows the fleet for the bulk burst and
drains it back with ``swapless drain``, and nothing is lost. It never writes the committed ``bench/AUTOSCALE.md``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
AUTOSCALE_MD = REPO / "bench" / "AUTOSCALE.md"


@pytest.mark.slow
def test_quick_mode_scales_up_for_the_burst_and_back_down(redis_url: str, tmp_path: Path) -> None:
    committed = AUTOSCALE_MD.read_text() if AUTOSCALE_MD.exists() else None
    target = tmp_path / "AUTOSCALE-quick.md"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SWAPLESS_BENCH_REDIS_URL": redis_url}
    done = subprocess.run([sys.executable, "-m", "bench.autoscale", "--quick", "--fleets", "autoscaled", "--write",
                           str(target)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    text = target.read_text()
    assert text in done.stdout
    assert "**Every row is simulated**" in text
    row = next(line for line in text.splitlines() if line.startswith("| autoscaled"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    gpu_s, most_workers, lost = float(cells[1]), int(cells[7]), int(cells[8])
    assert most_workers == 2, row  # it asked for the second worker the burst needed
    assert lost == 0, row
    assert gpu_s > 0, row
    log = done.stdout
    assert "joins [" in log and "joins []" not in log, log[-2000:]  # a worker joined during the day
    assert (AUTOSCALE_MD.read_text() if AUTOSCALE_MD.exists() else None) == committed
