"""``make demo``'s job, ``python -m parallelenv.demo``, on the local backends."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

from parallelenv import demo

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_demo_prints_a_row_per_backend_and_draws_the_chart(no_leaks, capsys, tmp_path):
    modes = ["dummy", "subproc"] + (["tensor"] if importlib.util.find_spec("torch") else [])
    chart = tmp_path / "chart.png"
    demo.main(["--steps", "30", "--num-envs", "4", "--modes", *modes, "--chart", str(chart)])
    out, err = capsys.readouterr()
    speeds, parts = out.split("Where a batch step's time goes")
    rows = {line.split("|")[1].strip(): line for line in speeds.splitlines() if line.startswith("| ") and "backend" not in line}
    assert sorted(rows) == sorted(modes)
    breakdown = {line.split("|")[1].strip(): [float(cell) for cell in line.split("|")[2:-1]]
                 for line in parts.splitlines() if line.startswith("| ") and "backend" not in line}
    assert sorted(breakdown) == sorted(modes)
    for wall, *each in breakdown.values():  # the parts of a batch step add up to its wall time
        assert sum(each) == pytest.approx(wall, rel=0.1)
    assert rows["subproc"].rstrip(" |").endswith("yes")
    if "tensor" in rows:
        assert "n/a: own RNG" in rows["tensor"]
    for mode in modes:  # start-up on a line of its own, before the stepping
        assert out.index(f"{mode:>11}: started in") < out.index(f"{mode:>11}: 30 steps in")
    assert "\r" not in out + err, "captured output is no terminal: the progress bar must stay off"
    if importlib.util.find_spec("matplotlib") is None:
        assert "No chart" in out and not chart.exists()
        return
    assert f"per backend: {chart.resolve()}" in out
    assert chart.read_bytes()[:8] == PNG_SIGNATURE
    import matplotlib.pyplot as plt

    image = plt.imread(chart)
    assert image.shape[1] > image.shape[0] > 100 and image.std() > 0.05  # three panels of bars, not a blank page


def test_a_backend_steps_for_the_seconds_given_at_most(no_leaks):
    actions = np.zeros((1_000_000, 2), dtype=np.int64)
    run = demo.run_backend("dummy", actions, seconds=0.05)
    assert 1 <= run.steps < len(actions)
    assert run.steps == len(run.checksums) and run.stepping_s < 5


def test_trajectories_are_compared_over_the_steps_both_ran():
    reference = demo.Run("dummy", steps=3, checksums=[1.0, 2.0, 3.0])
    assert demo.same_trajectory(demo.Run("ray", steps=2, checksums=[1.0, 2.0]), reference) == "yes"
    assert demo.same_trajectory(demo.Run("ray", steps=2, checksums=[1.0, 2.5]), reference) == "NO"
    assert demo.same_trajectory(demo.Run("tensor", steps=2, checksums=[1.0, 2.5]), reference) == "n/a: own RNG"


def test_ray_auth_notice_is_silenced_only_before_ray_is_imported(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "unset by the test")  # so that monkeypatch restores the caller's value
    monkeypatch.delenv("RAY_AUTH_MODE")
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    demo.quiet_ray(["dummy", "subproc"])
    assert "RAY_AUTH_MODE" not in os.environ
    demo.quiet_ray(["dummy", "ray"])
    assert os.environ["RAY_AUTH_MODE"] == "token"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    demo.quiet_ray(["ray"])
    assert os.environ["RAY_AUTH_MODE"] == "disabled"
    monkeypatch.delenv("RAY_AUTH_MODE")
    monkeypatch.setitem(sys.modules, "ray", sys)  # any module: Ray counts as imported
    demo.quiet_ray(["ray"])
    assert "RAY_AUTH_MODE" not in os.environ
