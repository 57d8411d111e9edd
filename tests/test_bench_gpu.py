"""``python -m bench.gpu``: the quick mode runs end to end on the CPU and writes every row of its table; the full
mode refuses without CUDA and writes nothing; a run that is not a full one on CUDA never writes ``bench/GPU.md``.

The subprocesses see no GPU (``CUDA_VISIBLE_DEVICES`` empty), so these tests check the CPU path on any machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from bench.common import OUT
from bench.gpu import QUICK, default_output
from bench.gpu_probe import DeviceInfo

REPO = Path(__file__).resolve().parent.parent
GPU_MD = REPO / "bench" / "GPU.md"


def run_bench(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``python -m bench.gpu ARGS`` from the repository, with no CUDA device visible."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "bench.gpu", *args],
        cwd=REPO,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def table_rows(text: str) -> list[list[str]]:
    """The cells of every data row (not the header rows) of every Markdown table in ``text``."""
    lines = text.splitlines()
    rows = []
    for line, after in zip(lines, [*lines[1:], ""], strict=True):
        if line.startswith("| ") and not after.startswith("|---"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_the_full_run_refuses_without_cuda_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    committed = GPU_MD.read_text()
    target = tmp_path / "GPU.md"
    done = run_bench("--write", str(target), timeout_s=60)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "no CUDA device" in lines[0] and "--allow-cpu" in lines[0] and "--quick" in lines[0]
    assert not target.exists()
    assert GPU_MD.read_text() == committed


def test_only_a_full_run_on_cuda_writes_the_committed_table() -> None:
    cuda = DeviceInfo("cuda", "cuda (NVIDIA H200)", 141 * 1024**3)
    cpu = DeviceInfo("cpu", "cpu", None)
    assert default_output(quick=False, info=cuda) == GPU_MD
    for quick, info in ((True, cuda), (True, cpu), (False, cpu)):
        assert default_output(quick=quick, info=info).is_relative_to(OUT)


@pytest.mark.slow
def test_quick_mode_runs_on_cpu_and_writes_every_row(redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    committed = GPU_MD.read_text()
    target = tmp_path / "GPU-quick.md"
    done = run_bench("--quick", "--redis-url", redis_url, "--key-prefix", key_prefix, "--write", str(target),
                     timeout_s=150)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    text = target.read_text()
    assert text in done.stdout  # the table printed is the one written
    assert "Measured on **cpu**" in text
    rows = {row[0]: row for row in table_rows(text)}
    measurements = [
        "mixed burst: jobs/s", "mixed burst: model loads", "single-model stream: jobs/s",
        "worker CPU per job, mixed burst (ms)", "worker CPU per job, single-model stream (ms)",
    ]
    figures = [
        "total device memory", "memory budget in effect for a worker started with no `--memory-budget`",
        "headroom (no budget: total device memory − worker peak)",
    ]
    for name in measurements + QUICK.model_ids + figures:
        assert name in rows, f"no row {name!r} in:\n{text}"
    assert all("cpu" in row for row in rows.values()), "every row names its device"
    for name in ("mixed burst: jobs/s", "single-model stream: jobs/s", "worker CPU per job, single-model stream (ms)"):
        _, _, _, measured, baseline, ratio = rows[name]
        assert float(measured) > 0 and baseline.split()[0] in ("limit", "in-process") and float(ratio) > 0, rows[name]
    for model_id in QUICK.model_ids:
        assert rows[model_id][-1] == "n/a (no CUDA)"  # memory after unload: no CUDA figure on a CPU
        assert float(rows[model_id][4]) > 0  # its load time
    assert rows["total device memory"][-1] == "n/a (no CUDA)"
    assert GPU_MD.read_text() == committed
    assert not list(redis.Redis.from_url(redis_url).scan_iter(match=f"{key_prefix}*", count=1000))
