"""An env run in the caller raises its own exception under the EnvError: a debugger reaches the env's frames."""

from __future__ import annotations

import io
import pdb
import pickle

import gymnasium as gym
import pytest
from envs import FailingResetEnv, FaultyEnv, counting

from parallelenv import EnvError, ParallelEnv
from parallelenv.calls import Failure
from parallelenv.errors import RemoteTraceback

IN_CALLER = ["dummy", "toy"]


def frames(traceback):
    while traceback is not None:
        yield traceback.tb_frame
        traceback = traceback.tb_next


def env_frame(traceback, method: str, env_type: type) -> object:
    """The frame of ``env_type.method`` in ``traceback``, or None."""
    for frame in frames(traceback):
        if frame.f_code is getattr(env_type, method).__code__:
            return frame
    return None


def make_failing_factory() -> gym.Env:
    raise OSError("no display to build this env on")


@pytest.mark.parametrize("backend", IN_CALLER)
def test_the_cause_is_the_envs_own_exception_with_its_frames(make_penv):
    penv = make_penv([counting(0, 100), lambda: FaultyEnv(1, at_step=1)])
    penv.reset(seed=0)
    with pytest.raises(EnvError) as caught:
        penv.step([1, 1])
    error = caught.value
    cause = error.__cause__
    assert type(cause) is RuntimeError and str(cause) == "env 1 broke on purpose"
    frame = env_frame(cause.__traceback__, "step", FaultyEnv)
    assert frame is not None and frame.f_locals["self"].tag == 1  # the env itself, as it was when it raised
    # Every field an EnvError has is still there.
    assert (error.env_index, error.method, error.exc_type, error.message) == (1, "step", "RuntimeError",
                                                                              "env 1 broke on purpose")
    assert 'raise RuntimeError(f"env {self.tag} broke on purpose")' in error.remote_traceback
    assert error.failed_env_ids == [1] and error.results[4]["env_id"].tolist() == [0]


@pytest.mark.parametrize("backend", IN_CALLER)
def test_the_error_raised_ends_in_the_envs_frame_where_pdb_pm_looks(make_penv):
    penv = make_penv([lambda: FailingResetEnv(0), counting(1)])
    with pytest.raises(EnvError) as caught:
        penv.reset(seed=0)
    # pdb.pm() debugs sys.last_traceback, the traceback of the error raised (not of its cause), at its last frame.
    *_, last = frames(caught.value.__traceback__)
    assert last.f_code is FailingResetEnv.reset.__code__
    out = io.StringIO()
    debugger = pdb.Pdb(stdin=io.StringIO("p self.tag, seed\nq\n"), stdout=out, nosigint=True)
    debugger.reset()
    debugger.interaction(None, caught.value.__traceback__)  # what pdb.post_mortem does
    assert "(0, " in out.getvalue() and "cannot reset" in out.getvalue()


def test_a_factory_raising_in_the_caller_is_reachable_too(no_leaks):
    with pytest.raises(EnvError) as caught:
        ParallelEnv([counting(0), make_failing_factory], para_mode="dummy")
    assert caught.value.method == "make" and type(caught.value.__cause__) is OSError
    assert any(frame.f_code is make_failing_factory.__code__ for frame in frames(caught.value.__cause__.__traceback__))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["subproc"])
def test_an_env_in_another_process_still_gives_its_traceback_as_text(make_penv):
    penv = make_penv([counting(0, 100), lambda: FaultyEnv(1, at_step=1)])
    penv.reset(seed=0)
    with pytest.raises(EnvError) as caught:
        penv.step([1, 1])
    assert isinstance(caught.value.__cause__, RemoteTraceback)
    assert "broke on purpose" in caught.value.__cause__.traceback_text


def test_a_failure_travels_without_its_exception():
    try:
        raise KeyError("gone")
    except KeyError as exc:
        failure = Failure.from_exception(3, "step", exc)
    assert failure.exception is not None
    copy = pickle.loads(pickle.dumps(failure))
    assert copy.exception is None and copy == failure
    assert isinstance(copy.error().__cause__, RemoteTraceback)
