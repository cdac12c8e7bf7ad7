"""The soak's short form (``make soak`` runs it for minutes per backend): seconds per CPU backend.

Each backend steps under faults injected at seeded steps, with healing and
recycling on; the failure log must match the faults, and the parent's and
workers' resources must stay flat and leave nothing behind after close().
The judge itself is checked to fail on a leak, so that a PASS means something.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import HAS_RAY

from parallelenv.healing import ENV_ERROR, WORKER_DIED, WORKER_RECYCLED, SurvivedFailure

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # soak/ is not installed: importable from the checkout only

from soak.faults import Fault  # noqa: E402
from soak.judge import bounded, flat  # noqa: E402
from soak.profiles import PROFILES  # noqa: E402
from soak.report import block  # noqa: E402
from soak.run import _log_verdict, soak  # noqa: E402

# Seconds per backend, going on until each kind of fault was injected once; recycles often enough
# that one happens before. On Ray, where a new actor takes seconds (and recycling by steps
# replaces every actor at once), two envs and fewer kinds of fault: test_healing soaks them all.
RAY_FAULTS = ("step raises", "reset raises", "killed")
SHORT = {
    "dummy": (2, dict(fault_every=1_000)),
    "subproc": (4, dict(fault_every=100, leak_kb=256, recycle_headroom_mb=16, call_timeout=2.0)),
    "ray": (3, dict(num_envs=2, faults=RAY_FAULTS, fault_every=20, recycle_steps=40)),
    "ray-subproc": (3, dict(num_envs=2, options={"num_actors": 2, "num_workers_per_actor": 1}, faults=RAY_FAULTS,
                            fault_every=20, recycle_steps=40)),
}


def check_short_soak(para_mode: str) -> None:
    seconds, changes = SHORT[para_mode]
    profile = dataclasses.replace(PROFILES[para_mode], **changes)
    outcome = soak(profile, seconds, seed=1, min_faults=len(profile.faults))
    table = block(outcome)
    assert outcome.passed, table
    assert set(outcome.injected) == set(profile.faults), table  # kinds come in rounds: each one once
    if profile.has_workers:
        assert outcome.logged[WORKER_RECYCLED] >= 1, table


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("para_mode", ["dummy", "subproc"])
def test_a_short_soak_stays_flat(para_mode):
    check_short_soak(para_mode)


@pytest.mark.skipif(not HAS_RAY, reason="needs ray (pip install -e '.[ray]')")
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("para_mode", ["ray", "ray-subproc"])
def test_a_short_soak_on_ray_stays_flat(ray_session, para_mode):
    check_short_soak(para_mode)


# ----------------------------------------------------------------- the judge can fail


def test_a_flat_noisy_series_with_a_spike_passes():
    series = [100.0 + (i % 3) * 0.5 for i in range(60)]
    series[45] = 400.0  # a worker replaced as the sample was taken
    verdict = flat("parent RSS", "MiB", series, allowance=16)
    assert verdict.passed and abs(verdict.growth) <= 0.5, verdict


def test_a_leaking_parent_fails():
    """0.5 MiB a sample: 30 MiB over the run, about 20 between the thirds' medians."""
    verdict = flat("parent RSS", "MiB", [100.0 + 0.5 * i for i in range(60)], allowance=16)
    assert not verdict.passed and verdict.growth == pytest.approx(20.0), verdict


def test_a_count_one_above_its_allowance_fails():
    assert not flat("fds", "", [30] * 20 + [31] * 20 + [35] * 20, allowance=4).passed
    assert flat("fds", "", [30] * 20 + [31] * 20 + [34] * 20, allowance=4).passed


def test_too_few_samples_fail_rather_than_pass():
    assert not flat("threads", "", [2, 2], allowance=4).passed


def test_a_worker_past_its_recycle_limit_fails():
    assert not bounded("worker RSS, max", "MiB", 30.0, [60.0, 80.0, 97.0], bound=96.0, rule="").passed
    assert bounded("worker RSS, max", "MiB", 30.0, [60.0, 80.0, 96.0], bound=96.0, rule="").passed


def _logged(*entries: tuple[str, tuple[int, ...]]) -> SimpleNamespace:
    return SimpleNamespace(failures=[SurvivedFailure(0.0, env_ids, kind, "") for kind, env_ids in entries])


def test_the_failure_log_must_match_the_faults_injected():
    faults = [Fault(10, 3, "step raises"), Fault(20, 5, "killed")]
    recycled = (WORKER_RECYCLED, (0, 1))
    assert _log_verdict(_logged((ENV_ERROR, (3,)), recycled, (WORKER_DIED, (4, 5))), faults).passed
    assert not _log_verdict(_logged((ENV_ERROR, (3,))), faults).passed  # one missing
    assert not _log_verdict(_logged((ENV_ERROR, (3,)), (ENV_ERROR, (5,))), faults).passed  # the wrong kind
    assert not _log_verdict(_logged((ENV_ERROR, (2,)), (WORKER_DIED, (4, 5))), faults).passed  # the wrong env
    assert not _log_verdict(_logged((ENV_ERROR, (3,)), (WORKER_DIED, (5,)), (ENV_ERROR, (1,))), faults).passed
