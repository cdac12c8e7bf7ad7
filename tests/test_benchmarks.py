"""The benchmark harness runs end to end (a smoke run: numbers are never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_quick_harness_run_writes_its_table_and_json(tmp_path, no_leaks):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--workloads", "cartpole8", "--wrappers",
         "parallelenv-dummy", "parallelenv-subproc", "gymnasium-sync", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=220,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(tmp_path.glob("*.json")).read_text())
    rows = {row["wrapper"]: row for row in result["rows"]}
    assert set(rows) == {"parallelenv-dummy", "parallelenv-subproc", "gymnasium-sync"}
    for row in rows.values():
        assert row.get("error") is None and row["median"] > 0, row
    assert "| cartpole8 |" in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_quick_tensor_workload_runs_every_wrapper(tmp_path, no_leaks):
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--workloads", "tensor-cartpole-4096", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=220, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["wrapper"]: row for row in json.loads(next(tmp_path.glob("*.json")).read_text())["rows"]}
    assert set(rows) == {"parallelenv-tensor", "tensorenv-direct", "gymnasium-numpy-vector"}
    for row in rows.values():
        assert row.get("error") is None and row["median"] > 0 and row["num_envs"] == 4096, row
