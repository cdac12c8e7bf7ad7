"""The benchmark harness: its plan, its report, and smoke runs end to end (numbers are never asserted)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks/ is not installed: importable from the checkout only

from benchmarks import report  # noqa: E402
from benchmarks.__main__ import parse_args, plan  # noqa: E402
from benchmarks.measure import Measurement  # noqa: E402
from benchmarks.revision import RevisionError, checkout  # noqa: E402


def _git_head() -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


HEAD = _git_head()
needs_git = pytest.mark.skipif(HEAD is None, reason="not a git checkout: --against has no revision to take")


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
        assert len(row["parent_cpu_us_per_step"]) == 1 and row["parent_cpu_us_per_step_median"] > 0, row
    assert "| cartpole8 |" in done.stdout
    assert "parent CPU us/env-step" in done.stdout and "parallel efficiency" in done.stdout
    # Not a terminal: a line per workload, not a bar whose redraws pile up on one line of the log.
    assert "[1/1] cartpole8: 3 run(s)" in done.stderr and "\r" not in done.stderr, done.stderr[-3000:]
    assert max(len(line) for line in (done.stdout + done.stderr).splitlines()) <= 300


@pytest.mark.slow
@pytest.mark.long  # the quick harness run below covers the harness in make test
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


def _labels(order):
    return [(round_index, pair.workload, pair.label) for round_index, pair in order]


def test_plan_interleaves_the_repeats_of_a_workloads_wrappers():
    args = parse_args(["--workloads", "cartpole8", "bigobs8", "--wrappers", "dummy", "gymnasium-sync",
                       "--repeats", "2", "--steps", "10"])
    assert _labels(plan(args)) == [
        (0, "cartpole8", "parallelenv-dummy"), (0, "cartpole8", "gymnasium-sync"),
        (1, "cartpole8", "parallelenv-dummy"), (1, "cartpole8", "gymnasium-sync"),
        (0, "bigobs8", "parallelenv-dummy"), (0, "bigobs8", "gymnasium-sync"),
        (1, "bigobs8", "parallelenv-dummy"), (1, "bigobs8", "gymnasium-sync"),
    ]


def test_plan_against_a_revision_measures_each_of_ours_twice_per_round():
    args = parse_args(["--quick", "--workloads", "cartpole8", "--wrappers", "parallelenv-subproc", "dummy",
                       "gymnasium-sync", "--against", "HEAD", "--repeats", "2"])
    twins = ["parallelenv-subproc", "parallelenv-subproc@HEAD", "parallelenv-dummy", "parallelenv-dummy@HEAD",
             "gymnasium-sync"]  # the peer is no parallelenv: no twin
    assert _labels(plan(args)) == [(r, "cartpole8", label) for r in (0, 1) for label in twins]
    assert {pair.revision for _, pair in plan(args)} == {None, "HEAD"}


def test_plan_measures_a_workload_round_by_round_beside_its_twin():
    args = parse_args(["--workloads", "noinfos8", "cartpole8", "infos8", "--wrappers", "dummy", "--repeats", "2"])
    assert [(r, w) for r, w, _ in _labels(plan(args))] == [
        (0, "noinfos8"), (0, "infos8"), (1, "noinfos8"), (1, "infos8"), (0, "cartpole8"), (1, "cartpole8")]
    assert parse_args(["--workloads", "infos"]).workloads == [
        "infos8", "noinfos8", "infos64", "noinfos64", "infos256", "noinfos256"]


def test_quick_leaves_out_the_workloads_and_peers_too_slow_to_start_and_has_a_budget():
    quick = parse_args(["--quick"])
    assert "cheetah8" in quick.workloads and "infos8" in quick.workloads and "cartpole64" not in quick.workloads
    assert quick.budget is not None and quick.wait_idle == 0
    assert "sb3-subproc" not in {pair.wrapper for _, pair in plan(quick)}
    assert "cartpole64" in parse_args(["--quick", "--workloads", "cartpole64"]).workloads  # named: measured
    full = parse_args([])
    assert full.budget is None and full.wait_idle > 0 and "infos256" in full.workloads


def test_a_workload_whose_simulator_is_missing_is_skipped_without_a_process(monkeypatch):
    from benchmarks import child
    from benchmarks.child import Pair

    real_find_spec = child.importlib.util.find_spec
    monkeypatch.setattr(child.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("mujoco", "envpool") else real_find_spec(name, *a))
    assert "mujoco not installed" in child.unavailable(Pair("cheetah8", "parallelenv-dummy", 10))
    assert child.unavailable(Pair("cheetah8", "envpool", 10)).startswith("mujoco, envpool not installed")
    assert child.unavailable(Pair("infos8", "parallelenv-dummy", 10)) is None


def test_a_spent_budget_writes_the_table_of_what_finished(tmp_path, capsys):
    from benchmarks.__main__ import main

    assert main(["--quick", "--workloads", "infos8", "--wrappers", "dummy", "--budget", "0",
                 "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "quick.json").read_text())
    assert result["settings"]["plan"]["stopped"] == "its --budget of 0 s was spent"
    assert result["rows"][0]["skipped"] == "not run: its --budget of 0 s was spent"
    assert "Stopped early" in capsys.readouterr().out


def test_waiting_for_an_idle_cpu_says_so_and_gives_up_after_its_patience():
    from benchmarks.machine import wait_for_quiet

    seen = []
    wait = wait_for_quiet(busy_percent=-1.0, patience_s=0.6, on_busy=lambda busy, waited: seen.append(waited))
    assert not wait.idle and wait.waited_s >= 0.6 and seen  # -1%: never idle
    assert wait_for_quiet(busy_percent=101.0, on_busy=lambda *_: pytest.fail("no wait")).idle


def test_the_infos_workload_and_its_twin_measure_and_compare(no_leaks):
    from benchmarks.measure import measure
    from benchmarks.workloads import WORKLOADS
    from benchmarks.wrappers import WRAPPERS

    measured = [measure(WORKLOADS[name], WRAPPERS["parallelenv-dummy"], steps=20, repeats=2).to_dict()
                for name in ("infos8", "noinfos8")]
    env = WORKLOADS["infos8"].make_env()
    env.reset(seed=0)
    assert len(env.step(0)[4]) == 4 and WORKLOADS["noinfos8"].make_env().step(0)[4] == {}
    rows = report.summarize(measured, cores=2)
    for row in rows:
        assert row["error"] is None and len(row["rates"]) == 2 and row["parent_cpu_us_per_env_step_median"] > 0
    assert rows[0]["against_twin"]["twin"] == "noinfos8" and rows[1]["against_twin"] is None
    assert "| infos8 | parallelenv-dummy | noinfos8 |" in report.markdown(rows, _meta())
    # EnvPool has only its own envs: named on another workload, it is a skip (so too where it is not installed).
    assert measure(WORKLOADS["infos8"], WRAPPERS["envpool"], steps=5, repeats=1).skipped


def test_parallel_efficiency_is_over_cores_times_the_fastest_in_process_wrapper():
    def row(wrapper, kind, median):
        return Measurement("busy8", wrapper, kind, wrapper.startswith("parallelenv"), 8, 10, rates=[median],
                           parent_cpu_us_per_step=[1.0], startup_s=0.1).to_dict()

    rows = report.summarize([row("parallelenv-dummy", "in-process", 100.0), row("gymnasium-sync", "in-process", 125.0),
                             row("parallelenv-subproc", "subprocess", 225.0), row("envpool", "subprocess", 250.0)],
                            cores=2)
    assert {r["wrapper"]: r["parallel_efficiency"] for r in rows} == {
        "parallelenv-dummy": 0.4, "gymnasium-sync": 0.5, "parallelenv-subproc": 0.9, "envpool": 1.0}
    assert {r["serial_reference"] for r in rows} == {"gymnasium-sync"}
    assert report.parallel_efficiency(300.0, 100.0, cores=4) == 0.75
    assert "| busy8 | **parallelenv-subproc** | subprocess | 8 | 225 | 4444.4 | 0.12 | 0.90x | 0.90 |" in \
        report.markdown(rows, _meta())
    assert report.summarize([row("parallelenv-subproc", "subprocess", 225.0)], cores=2)[0]["parallel_efficiency"] is None


# Each simulator under one of ours and EnvPool in make test (where the bench extra is installed), the rest long.
@pytest.mark.parametrize(("workload", "wrapper"), [
    ("cheetah8", "parallelenv-subproc"), ("pong8", "envpool"),
    pytest.param("cheetah8", "envpool", marks=pytest.mark.long),
    pytest.param("pong8", "parallelenv-subproc", marks=pytest.mark.long)])
def test_the_real_workloads_run_where_their_simulators_are_installed(workload, wrapper, no_leaks):
    from benchmarks.measure import measure
    from benchmarks.workloads import WORKLOADS
    from benchmarks.wrappers import WRAPPERS

    for module in WORKLOADS[workload].requires + WRAPPERS[wrapper].requires:
        pytest.importorskip(module)  # the bench extra's; make test installs the test extra
    result = measure(WORKLOADS[workload], WRAPPERS[wrapper], steps=5, repeats=1)
    assert result.error is None and result.skipped is None and result.rates[0] > 0, result


def test_repeats_measured_apart_merge_into_one_row():
    def part(rate, cpu, startup, rss, error=None):
        return Measurement("bigobs8", "parallelenv-subproc", "subprocess", True, 8, 10, rates=[rate],
                           parent_cpu_us_per_step=[cpu], startup_s=startup, peak_rss_mib=rss, error=error)

    merged = Measurement.merge([part(1.0, 5.0, 0.3, None), part(3.0, 7.0, 0.1, 20.0),
                                part(2.0, 6.0, 0.2, 10.0, error="boom")])
    assert merged.rates == [1.0, 3.0, 2.0] and merged.parent_cpu_us_per_step == [5.0, 7.0, 6.0]
    assert merged.startup_s == 0.2 and merged.peak_rss_mib == 20.0 and merged.error == "boom"


def _meta(against=None):
    machine = {"date": "2026-11-23 12:00 UTC", "cpu": "CPU", "cores": 2, "memory_gib": 4.0, "os": "Linux",
               "python": "3.11", "versions": {}}
    settings = {"mode": "quick", "repeats": 2, "steps": {"cartpole8": 10}, "against": against, "wall_s": 1.0,
                "load_average": {"start": 0.1, "end": 0.2}}
    return {"machine": machine, "settings": settings}


def test_report_shows_parent_cpu_per_step_and_the_ratio_to_the_revision(tmp_path):
    def row(wrapper, ours, rates, cpu, revision=None):
        return Measurement("cartpole8", wrapper, "in-process", ours, 8, 10, rates=rates,
                           parent_cpu_us_per_step=cpu, startup_s=0.01, revision=revision).to_dict()

    rows = report.summarize([
        row("parallelenv-dummy", True, [200.0, 220.0], [40.0, 60.0]),
        row("parallelenv-dummy@abc", True, [100.0, 100.0], [100.0, 100.0], revision="abc"),
        row("gymnasium-sync", False, [100.0, 110.0], [80.0, 100.0]),
    ])
    ours = rows[0]
    assert ours["parent_cpu_us_per_step_median"] == 50.0
    assert ours["against_revision"] == {"revision": "abc", "steps_per_s_ratio": 2.1, "round_ratios": [2.0, 2.2],
                                        "parent_cpu_ratio": 0.5}
    assert rows[1]["against_revision"] is None and rows[2]["against_revision"] is None

    table = report.markdown(rows, _meta({"revision": "abc", "commit": "abc1234567890"}))
    header = next(line for line in table.splitlines() if line.startswith("| workload | wrapper | kind"))
    cpu_column = header.split(" | ").index("parent CPU us/env-step")
    cells = {line.split(" | ")[1]: line.split(" | ") for line in table.splitlines() if line.startswith("| cartpole8")}
    assert cells["**parallelenv-dummy**"][cpu_column] == "6.25"  # 50 us a batch step of 8 envs
    assert cells["gymnasium-sync"][cpu_column] == "11.25"
    assert "| cartpole8 | parallelenv-dummy | 2.100x | 2.000..2.200 | 0.500x |" in table
    assert "Working tree / abc (abc1234567)" in table

    report.write_json(tmp_path / "out.json", rows, _meta())
    written = {r["wrapper"]: r for r in json.loads((tmp_path / "out.json").read_text())["rows"]}
    assert written["gymnasium-sync"]["parent_cpu_us_per_step_median"] == 90.0
    assert written["gymnasium-sync"]["parent_cpu_us_per_env_step_median"] == 11.25
    assert written["parallelenv-dummy"]["against_revision"]["steps_per_s_ratio"] == 2.1


def test_report_gives_a_variants_ratio_to_its_baseline_round_by_round():
    def row(wrapper, rates, cpu):
        return Measurement("collect16", wrapper, "subprocess", True, 16, 10, rates=rates,
                           parent_cpu_us_per_step=cpu, startup_s=0.5).to_dict()

    rows = report.summarize([row("parallelenv-collect-plain", [100.0, 200.0], [10.0, 10.0]),
                             row("parallelenv-collect-overlapped", [150.0, 260.0], [12.0, 12.0])])
    assert rows[0]["against_baseline"] is None
    assert rows[1]["against_baseline"] == {"baseline": "parallelenv-collect-plain", "steps_per_s_ratio": 205 / 150,
                                           "round_ratios": [1.5, 1.3], "parent_cpu_ratio": 1.2}
    table = report.markdown(rows, _meta())
    assert ("| collect16 | parallelenv-collect-overlapped | parallelenv-collect-plain | 1.367x | 1.300..1.500 "
            "| 1.200x |") in table
    # Without its baseline in the run, a variant has no ratio and the table is left out.
    alone = report.summarize([row("parallelenv-collect-overlapped", [150.0], [12.0])])
    assert alone[0]["against_baseline"] is None and "Variants / their baseline" not in report.markdown(alone, _meta())


def test_the_overlapped_collect_wrapper_collects_with_its_policy(no_leaks):
    pytest.importorskip("torch")
    from benchmarks.workloads import WaitEnv
    from benchmarks.wrappers import WRAPPERS

    runner = WRAPPERS["parallelenv-collect-overlapped"].make([WaitEnv] * 2)
    try:
        runner.reset(0)
        assert runner.run(np.zeros((3, 2), np.int64)) == 6  # the pre-sampled actions say how many steps
        assert runner.worker.overlap
    finally:
        runner.close()


@needs_git
def test_checkout_of_a_revision_is_removed_after_the_block_also_on_error():
    with checkout("HEAD", ROOT) as revision:
        assert revision.commit == HEAD
        assert (revision.root / "parallelenv" / "__init__.py").is_file()
        assert not (revision.root / "benchmarks").exists()  # the harness stays the working tree's
    assert not revision.root.exists()
    with pytest.raises(KeyError), checkout("HEAD", ROOT) as revision:
        raise KeyError("a run that fails")
    assert not revision.root.exists()
    with pytest.raises(RevisionError, match="no-such-revision"), checkout("no-such-revision", ROOT):
        pass


@needs_git
@pytest.mark.slow
@pytest.mark.long  # --against's clean-up is in make test (the interrupted run below)
@pytest.mark.timeout(240)
def test_quick_run_against_head_measures_both_packages_interleaved(tmp_path, no_leaks):
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--workloads", "cartpole8", "--wrappers", "dummy",
         "gymnasium-sync", "--against", "HEAD", "--repeats", "2", "--steps", "30", "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=220, env={**os.environ, "TMPDIR": str(temp)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "quick.json").read_text())
    assert result["settings"]["against"] == {"revision": "HEAD", "commit": HEAD}
    rows = {row["wrapper"]: row for row in result["rows"]}
    assert list(rows) == ["parallelenv-dummy", "parallelenv-dummy@HEAD", "gymnasium-sync"]
    for row in rows.values():
        assert row["error"] is None and len(row["rates"]) == 2 and len(row["parent_cpu_us_per_step"]) == 2, row
    assert rows["parallelenv-dummy"]["parallelenv_path"] == str(ROOT / "parallelenv")
    assert rows["parallelenv-dummy@HEAD"]["parallelenv_path"].startswith(str(temp))
    assert rows["parallelenv-dummy"]["against_revision"]["steps_per_s_ratio"] > 0
    assert "Working tree / HEAD" in done.stdout
    assert not list(temp.glob("parallelenv-*"))  # REV's copy is gone


@needs_git
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("stop", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.long)],
                         ids=["ctrl-c", "kill"])
def test_an_interrupted_run_removes_the_revisions_copy_and_its_child(tmp_path, stop):
    temp = tmp_path / "tmp"
    temp.mkdir()
    harness = subprocess.Popen(
        [sys.executable, "-m", "benchmarks", "--quick", "--workloads", "cartpole8", "--wrappers", "dummy",
         "--against", "HEAD", "--steps", "1000000", "--out", str(tmp_path / "out")],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(temp)},
        # Ctrl-C as a terminal delivers it: a test runner's worker may ignore SIGINT, which its children inherit.
        preexec_fn=_sigint_as_by_default,
    )
    try:
        children = _wait_for_a_measuring_child(harness)
        assert list(temp.glob("parallelenv-*"))  # REV's copy exists while the run goes on
        harness.send_signal(stop)
        harness.wait(timeout=60)
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
    assert harness.returncode != 0
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, alive
    assert not list(temp.glob("parallelenv-*"))
    # What had finished (here nothing) is written all the same, saying why the rest is missing.
    result = json.loads((tmp_path / "out" / "quick.json").read_text())
    assert result["settings"]["plan"]["stopped"] == "interrupted"
    assert {row["skipped"] for row in result["rows"]} == {"not run: interrupted"}


def _sigint_as_by_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for_a_measuring_child(harness: subprocess.Popen, patience_s: float = 60.0) -> list[psutil.Process]:
    """The harness's descendants once one of them measures (its log is being written)."""
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        children = psutil.Process(harness.pid).children(recursive=True)
        if any("benchmarks._one" in " ".join(_cmdline(child)) for child in children):
            return children
        assert harness.poll() is None, "the harness ended before it measured anything"
        time.sleep(0.2)
    raise AssertionError(f"no measuring process within {patience_s} s")


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def test_the_many_worker_workloads_run_each_path_and_the_peers_where_k_is_one():
    from benchmarks.workloads import WORKLOADS
    from benchmarks.wrappers import default_wrappers

    ours = ["parallelenv-subproc-counted", "parallelenv-subproc-perpipe", "parallelenv-subproc-healing"]
    # Each beside the bound of a lockstep with no library (benchmarks/lockstep.py).
    assert default_wrappers("sleep5-64x1", quick=False) == ours + ["lockstep", "gymnasium-async", "sb3-subproc"]
    assert default_wrappers("sleep20-64x4", quick=False) == ours + ["lockstep"]
    assert (WORKLOADS["sleep5-64x4"].num_envs, WORKLOADS["sleep5-64x4"].envs_per_worker) == (256, 4)
    assert WORKLOADS["sleep20-8x1"].wait_s == 0.02
    assert [w for w in parse_args(["--quick"]).workloads if w.startswith("sleep")] == ["sleep5-8x1"]
    assert "ceiling" in default_wrappers("cheetah8", quick=True) and "ceiling" not in default_wrappers("busy8", False)


def test_seen_cores_widens_what_parallelenv_reads_in_this_process_only_while_the_block_lasts():
    from benchmarks.machine import seen_cores, usable_cores
    from parallelenv.backends.base import available_cpus

    real = available_cpus()
    with seen_cores(64):
        assert available_cpus() == 64 and usable_cores() == 64 and os.cpu_count() == 64
        child = subprocess.run([sys.executable, "-c", "import os; print(len(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True, check=True)
        assert int(child.stdout) == real  # a process started afresh sees the real cores
    assert available_cpus() == real


@pytest.mark.timeout(120)
def test_the_paths_of_the_many_worker_workload_measure_the_callers_cost(no_leaks):
    from benchmarks.measure import measure
    from benchmarks.workloads import WORKLOADS
    from benchmarks.wrappers import WRAPPERS

    measured = {name: measure(WORKLOADS["sleep5-8x1"], WRAPPERS[name], steps=10, repeats=1)
                for name in ("parallelenv-subproc-counted", "parallelenv-subproc-perpipe",
                             "parallelenv-subproc-healing")}
    for result in measured.values():
        assert result.error is None and result.workers == 8 and result.rates[0] > 0, result
        assert result.env_step_s >= 0.005 and result.parent_cpu_us_per_step[0] > 0
    assert measured["parallelenv-subproc-counted"].cores_seen == 8
    assert measured["parallelenv-subproc-healing"].cores_seen == 8
    perpipe = measured["parallelenv-subproc-perpipe"].cores_seen
    assert (perpipe or len(os.sched_getaffinity(0))) < 8  # fewer cores seen than workers, made so or real
    rows = report.summarize([m.to_dict() for m in measured.values()], cores=2)
    # No upper bound: on a busy machine the step timed alone can wake later than the workers' steps did.
    assert all(row["wait_efficiency"] > 0 and row["parent_cpu_us_per_worker"] > 0 for row in rows)


@pytest.mark.timeout(120)
def test_the_ceiling_steps_its_share_of_the_envs_in_bare_processes(no_leaks):
    from benchmarks.ceiling import CeilingRunner
    from benchmarks.machine import usable_cores
    from benchmarks.measure import measure
    from benchmarks.workloads import WORKLOADS, JitterEnv
    from benchmarks.wrappers import WRAPPERS

    result = measure(WORKLOADS["cartpole8"], WRAPPERS["ceiling"], steps=30, repeats=1)
    assert result.error is None and result.rates[0] > 0 and result.workers == min(8, usable_cores()), result
    # Each env gets its own column of actions and episodes restart: 3 envs, 250 steps of 200-step episodes.
    runner = CeilingRunner([JitterEnv] * 3)
    try:
        runner.reset(0)
        assert runner.run(np.zeros((250, 3), np.int64)) == 750 and runner.own_rate() > 0
        assert sorted(int(i) for share in runner.shares for i in share) == [0, 1, 2]
    finally:
        runner.close()


@pytest.mark.timeout(120)
def test_the_lockstep_bound_steps_groups_of_envs_and_raises_what_an_env_raised(no_leaks):
    import functools

    from envs import FaultyEnv

    from benchmarks.lockstep import LockstepRunner
    from benchmarks.measure import measure
    from benchmarks.workloads import WORKLOADS
    from benchmarks.wrappers import WRAPPERS

    result = measure(WORKLOADS["sleep5-8x1"], WRAPPERS["lockstep"], steps=10, repeats=1)
    assert result.error is None and result.workers == 8 and result.rates[0] > 0, result
    assert result.env_step_s >= 0.005 and result.parent_cpu_us_per_step[0] > 0
    for how, error in (("raise", "env 3 broke on purpose"), ("exit", "a lockstep process died")):
        envs = [functools.partial(FaultyEnv, tag=i, at_step=2, how=how if i == 3 else "none") for i in range(5)]
        runner = LockstepRunner(envs, envs_per_worker=2)
        try:
            assert runner.workers == 3 and runner.shares == [[0, 1], [2, 3], [4]]
            runner.reset(0)
            runner.step(np.zeros(5, np.int64))
            with pytest.raises(RuntimeError, match=error):  # not a hang
                runner.step(np.zeros(5, np.int64))
        finally:
            runner.close()


def test_report_gives_the_callers_cost_per_worker_the_efficiency_and_the_ratio_to_the_ceiling():
    def row(workload, wrapper, kind, n, rate, cpu, workers, step_s=None, cores_seen=None):
        return Measurement(workload, wrapper, kind, wrapper.startswith("parallelenv"), n, 10, rates=[rate],
                           parent_cpu_us_per_step=[cpu], startup_s=0.1, workers=workers, env_step_s=step_s,
                           cores_seen=cores_seen).to_dict()

    rows = report.summarize([
        # 64 workers of 4 envs whose step lasts 5 ms: at most 64 / 5 ms = 12,800 env-steps/s.
        row("sleep5-64x4", "parallelenv-subproc-counted", "subprocess", 256, 9600.0, 640.0, 64, 0.005, 64),
        row("cheetah8", "ceiling", "ceiling", 8, 20000.0, 1.0, 2),
        row("cheetah8", "parallelenv-subproc", "subprocess", 8, 13000.0, 60.0, 2),
        row("cheetah8", "envpool", "subprocess", 8, 30000.0, 900.0, None),
    ], cores=2)
    sleep, ceiling, ours, envpool = rows
    assert sleep["wait_efficiency"] == pytest.approx(0.75) and sleep["parent_cpu_us_per_worker"] == 10.0
    assert ours["against_ceiling"] == {"ceiling": "ceiling", "ratio": 0.65} and ceiling["against_ceiling"] is None
    assert ours["best_peer"] == "envpool" and ceiling["ratio_to_best_peer"] is None  # the ceiling is no peer
    table = report.markdown(rows, _meta())
    assert "| sleep5-64x4 | **parallelenv-subproc-counted** | 64 x 4 | 64 (made to see) | 640 | 10.0 | 5.00 | 0.75 |" \
        in table
    assert "| cheetah8 | **parallelenv-subproc** | 2 x 4 | 2 | 60 | 30.0 |  |  | 0.65x |" in table
    assert "| cheetah8 | envpool | in caller x 8 | 2 | 900 |  |  |  | 1.50x |" in table


@pytest.mark.timeout(120)
def test_the_gpu_check_reports_on_a_machine_without_cuda_too(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from benchmarks import gpu_check

    out = tmp_path / "gpu.md"
    assert gpu_check.main(["--sizes", "1024", "--steps", "3", "--repeats", "2", "--no-tests", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| 1,024 | cpu | ParallelEnv |" in text and "| 1,024 | cpu | direct |" in text
    if not torch.cuda.is_available():
        assert "no CUDA device here" in text
    # The device checks compare two devices; two CPUs agree to the bit.
    assert all(check["ok"] and check["max_difference"] == 0.0 for check in gpu_check.device_checks(torch, "cpu"))


def test_report_gives_what_each_added_worker_costs_the_caller(tmp_path):
    def row(workload, workers, cpu):
        return Measurement(workload, "parallelenv-subproc-counted", "subprocess", True, workers, 10, rates=[100.0],
                           parent_cpu_us_per_step=[cpu], startup_s=0.1, workers=workers, env_step_s=0.0051,
                           cores_seen=workers).to_dict()

    rows = report.summarize([row("sleep5-8x1", 8, 200.0), row("sleep5-64x1", 64, 312.0)], cores=2)
    assert report.added_worker_costs(rows) == {("parallelenv-subproc-counted", 5.0, 1): (8, 64, 2.0)}
    assert "parallelenv-subproc-counted 1 env(s) each, 5 ms steps, 8 -> 64 workers: 2.0 us" in \
        report.markdown(rows, _meta())
    report.write_json(tmp_path / "out.json", rows, _meta())
    written = json.loads((tmp_path / "out.json").read_text())["added_worker_costs"]
    assert written == [{"wrapper": "parallelenv-subproc-counted", "step_ms": 5.0, "envs_per_worker": 1,
                        "from_workers": 8, "to_workers": 64, "caller_us_per_added_worker": 2.0}]


# A measuring process of --against REV as benchmarks.child starts one: REV's folder first on the path and the
# working folder; it reports the modules it loaded from the harness and from parallelenv. benchmarks._one takes
# an editable install's finder out, so that a module REV lacks is not found in the checkout instead.
MEASURE_WITH_REV = """
import importlib.util, json, sys
from benchmarks._one import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(name for name in sys.modules
                                                  if name.partition(".")[0] in ("benchmarks", "parallelenv")),
                  "finds_what_rev_lacks": importlib.util.find_spec("parallelenv.pool") is not None}))
"""
# What the harness may import of the measured package: its public API, the modules a revision as old as
# 87653c1 has or a newer one adds (a wrapper of a feature REV lacks fails its row, and only that row).
PUBLIC_MODULES = ("parallelenv", "parallelenv.envs", "parallelenv.rollout", "parallelenv.pool", "parallelenv.tensor")


@pytest.mark.timeout(90)
def test_a_measuring_process_imports_no_internal_of_the_measured_package(tmp_path, no_leaks):
    """--against 87653c1 once failed every row: the lockstep bound's module (imported by every measuring
    process, through benchmarks.wrappers) imported parallelenv.backends.subproc.futex, which that revision
    lacks. Here REV is a parallelenv with nothing in it, and the lockstep bound still measures."""
    rev = tmp_path / "rev"
    (rev / "parallelenv").mkdir(parents=True)
    (rev / "parallelenv" / "__init__.py").write_text('"""A revision with none of the internals of today."""\n')
    done = subprocess.run(
        [sys.executable, "-c", MEASURE_WITH_REV, "--workload", "sleep5-8x1", "--wrapper", "lockstep",
         "--steps", "10", "--repeats", "1", "--result", str(tmp_path / "result.json"), "--parallelenv-from", str(rev)],
        cwd=rev, capture_output=True, text=True, timeout=75, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(rev), str(ROOT)])},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["error"] is None and result["skipped"] is None and result["rates"][0] > 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert not report["finds_what_rev_lacks"], "a module REV lacks was found outside REV's folder"
    loaded = report["modules"]
    assert [name for name in loaded if name.startswith("parallelenv.")] == []
    # And the imports it did not run here (other wrappers', made in their constructors): public ones alone.
    for name in (name for name in loaded if name.startswith("benchmarks")):
        path = Path(_module_file(name))
        for imported in _parallelenv_imports(path):
            assert imported in PUBLIC_MODULES or imported.startswith("parallelenv.integrations."), \
                f"{path.name}, run in every measuring process, imports {imported}: not the public API"


def _module_file(name: str) -> str:
    import importlib.util

    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    return spec.origin


def _parallelenv_imports(path: Path) -> list[str]:
    """Every module of parallelenv that ``path`` imports, at its top or inside a function."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [name for name in names if name.partition(".")[0] == "parallelenv"]
    return found


def _quick_rows(memory: bool) -> list[dict]:
    def row(workload, wrapper, kind, rate):
        return Measurement(workload, wrapper, kind, wrapper.startswith("parallelenv"), 8, 10, rates=[rate],
                           parent_cpu_us_per_step=[50.0], startup_s=0.1, peak_rss_mib=100.0 if memory else None,
                           peak_pss_mib=80.0 if memory else None).to_dict()

    return report.summarize([
        row("cartpole8", "parallelenv-dummy", "in-process", 120_000.0),
        row("cartpole8", "gymnasium-sync", "in-process", 125_000.0),
        row("bigobs8", "parallelenv-subproc", "subprocess", 110_000.0),
        row("bigobs8", "gymnasium-async", "subprocess", 18_000.0),  # 6x apart: once a log axis
    ], cores=2)


@pytest.mark.parametrize("memory", [False, True], ids=["quick", "memory-measured"])
def test_report_has_no_column_empty_in_every_row_and_no_long_line(memory):
    table = report.markdown(_quick_rows(memory), _meta())
    header = next(line for line in table.splitlines() if line.startswith("| workload | wrapper | kind"))
    assert ("peak RSS MiB (PSS)" in header) == memory
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    for column in range(len(header.split(" | "))):
        assert any(cells[column].strip(" |") for cells in rows[1:] if len(cells) == len(rows[0])), (header, column)
    assert max(len(line) for line in table.splitlines()) <= 300


def test_the_chart_shows_every_panel_on_one_linear_scale_labelled_with_ticks_apart():
    pytest.importorskip("matplotlib")
    fig = report.figure(_quick_rows(memory=False), "title")
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0 and ax.get_xlabel()
        labels = [label for label in ax.get_xticklabels() if label.get_text() and label.get_visible()]
        boxes = sorted((label.get_window_extent(renderer) for label in labels), key=lambda box: box.x0)
        assert len(boxes) >= 3
        for left, right in itertools.pairwise(boxes):
            assert left.x1 < right.x0, [label.get_text() for label in labels]  # no tick label runs into the next
    first_panel_title = fig.axes[0].title.get_window_extent(renderer)
    assert fig._suptitle.get_window_extent(renderer).y0 > first_panel_title.y1  # the chart's title above it


def test_tick_labels_are_short():
    assert [report.steps_label(v) for v in (0, 950, 12_000, 1_500_000, 2.4e9)] == ["0", "950", "12k", "1.5M", "2.4G"]
