"""``make demo``'s job, ``python -m parallelenv.demo``, on the local backends."""

from __future__ import annotations

import importlib.util

from parallelenv import demo


def test_demo_prints_a_row_per_backend_and_their_trajectories_agree(no_leaks, capsys):
    modes = ["dummy", "subproc"] + (["tensor"] if importlib.util.find_spec("torch") else [])
    demo.main(["--steps", "30", "--num-envs", "4", "--modes", *modes])
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ") and "backend" not in line}
    assert sorted(rows) == sorted(modes)
    assert rows["subproc"].rstrip(" |").endswith("yes")
    if "tensor" in rows:
        assert "n/a: own RNG" in rows["tensor"]
