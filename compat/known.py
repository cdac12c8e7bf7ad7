"""Why each peer test that our views fail is failed, where we know.

Two lists:

- :data:`NOT_OURS`: the test reaches into the peer's internals (its
  attributes, its two-phase async API, its worker's warnings), exercises an
  API the peer has and a ParallelEnv deliberately has not, or checks a
  behaviour we chose differently on purpose (each says where that choice is
  written down). These do not fail ``make compat``.
- :data:`OURS_PENDING`: ours to fix, with what the fix needs, so that the
  report says more than "failed". They still fail ``make compat``.

A failure in neither list is ours and unexplained. An entry that explains no
failure of a full run is reported as stale, so this list cannot outlive the
failures it explains.
"""

from __future__ import annotations

from dataclasses import dataclass

PARA_MODES = ("dummy", "subproc")


@dataclass(frozen=True)
class Known:
    peer: str  # "gymnasium" or "sb3"
    test: str  # node id without its parameters: path::function (or path::Class::function)
    reason: str
    params: tuple[str, ...] = ()  # some of them must be in the parameter id; () matches every parametrisation
    para_modes: tuple[str, ...] = PARA_MODES  # the runs in which it fails

    def matches(self, peer: str, nodeid: str, para_mode: str) -> bool:
        test, _, params = nodeid.partition("[")
        return (
            peer == self.peer
            and para_mode in self.para_modes
            and test == self.test
            and (not self.params or any(part in params for part in self.params))
        )


GYM = "tests/vector/"
ASYNC = GYM + "test_async_vector_env.py::"
VECTOR = GYM + "test_vector_env.py::"
OBS_MODES = GYM + "test_observation_mode.py::TestVectorEnvObservationModes::"
SB3 = "tests/test_vec_envs.py::"
TWO_PHASE = (
    "AsyncVectorEnv's own two-phase API (reset_async/reset_wait, step_async/step_wait with a timeout, their "
    "ordering errors and close() warnings) is not VectorEnv's; a ParallelEnv's is send()/recv(timeout=...)"
)
OBSERVATION_MODE = (
    "observation_mode='different' or a custom batched space is a peer-only API: a ParallelEnv's envs share one "
    "observation space, which fixes its shared buffers"
)
ENVS_LIST = "reads the peer's .envs, its list of env objects: the envs of a ParallelEnv may live in other processes"

NOT_OURS: list[Known] = [
    Known("gymnasium", ASYNC + "test_reset_timeout_async_vector_env", TWO_PHASE),
    Known("gymnasium", ASYNC + "test_step_timeout_async_vector_env", TWO_PHASE),
    Known("gymnasium", ASYNC + "test_reset_out_of_order_async_vector_env", TWO_PHASE),
    Known("gymnasium", ASYNC + "test_step_out_of_order_async_vector_env", TWO_PHASE),
    Known("gymnasium", ASYNC + "test_async_vector_subenv_error",
          "counts and matches AsyncVectorEnv's worker warnings ('Received the following error from Worker-0 - "
          "Shutting it down', ...); the EnvError itself is caught by its `pytest.raises(ValueError)`"),
    Known("gymnasium", GYM + "test_sync_vector_env.py::test_metadata_sync_vector_env", ENVS_LIST),
    Known("gymnasium", GYM + "test_sync_vector_env.py::test_check_spaces_sync_vector_env",
          "matches SyncVectorEnv's own message ('SyncVectorEnv(..., observation_mode='same') however ...'); "
          "ours names the env whose space differs"),
    Known("gymnasium", OBS_MODES + "test_obs_mode_same_different_spaces",
          "matches SyncVectorEnv's message, which points to its observation_mode='different'; ours names the env"),
    Known("gymnasium", OBS_MODES + "test_invalid_observation_mode", OBSERVATION_MODE),
    Known("gymnasium", OBS_MODES + "test_obs_mode_different_different_spaces", OBSERVATION_MODE),
    Known("gymnasium", OBS_MODES + "test_mixed_observation_spaces", OBSERVATION_MODE,
          params=("different-", "observation_mode2-")),
    Known("gymnasium", VECTOR + "test_final_obs_info",
          "steps a Discrete(4) env with the action 4, outside its action space (in the step where NEXT_STEP resets "
          "it and ignores the action): a ParallelEnv refuses actions outside the action space before sending any "
          "(tests/test_errors.py BAD_STEPS)"),
    Known("sb3", SB3 + "test_vecenv_custom_calls", ENVS_LIST, params=("DummyVecEnv",)),
    Known("sb3", SB3 + "test_subproc_start_method",
          "SubprocVecEnv(start_method='illegal_method') must raise; the dummy backend starts no process, so has no "
          "start method to refuse (on subproc it raises as SB3 does)", para_modes=("dummy",)),
    Known("sb3", SB3 + "test_vecenv_func_checker",
          "DummyVecEnv builds its envs in the caller, where one env captured by every factory is one object; the "
          "subproc backend unpickles each factory on its own, so each env is its own copy: nothing is shared to "
          "refuse (on dummy it is refused, as SB3 does)", para_modes=("subproc",)),
    Known("sb3", SB3 + "test_framestack_vecenv",
          "steps a uint8 Box action space with float64 zeros: a ParallelEnv refuses actions that do not cast safely "
          "to the action space's dtype (they go into typed, possibly shared, buffers; tests/test_errors.py)"),
    Known("gymnasium", ASYNC + "test_custom_space_async_vector_env_shared_memory",
          "expects AsyncVectorEnv(shared_memory=True) to refuse a custom space of no fixed shape; a ParallelEnv has "
          "no shared_memory switch: it keeps the fixed-shape parts in shared memory and sends the others pickled "
          "beside them (compat/shim.py)"),
]

OURS_PENDING: list[Known] = []


def find(entries: list[Known], peer: str, nodeid: str, para_mode: str) -> Known | None:
    """The first entry of ``entries`` explaining this failure, if any."""
    for entry in entries:
        if entry.matches(peer, nodeid, para_mode):
            return entry
    return None
