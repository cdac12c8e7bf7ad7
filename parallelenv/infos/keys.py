"""The info keys parallelenv itself writes: the one list of them, each with its meaning and when it is set.

Every module that writes (or reads back) one of these keys imports it from
here; no other module spells one (``tests/test_info_keys.py`` checks it).
An env's own keys go into the same info beside them, so an env that returns
one of these names itself has it overwritten, or read as the library's.
The strings and the ``_`` mask beside each key of a vector info are the
contract; a key is there only in a call where some env has it. The views'
names (Gymnasium's, SB3's) are those of the frameworks.
"""

from __future__ import annotations

MASK_PREFIX = "_"  # a vector info's mask of key k is MASK_PREFIX + k (Gymnasium's layout)

# asynchronous="restart": an env whose episode ended in the step was reset in that same step.
ENDED_STATE = "ended_state"  # the ended episode's last obs; written by the env hosts or built from Buffers.ended
RESET = "reset"  # True for the envs the policy reset in this step (the same envs)
RESET_INFO = "reset_info"  # that reset's info, where non-empty (the host's env.reset(); never the tensor backend)
RESTART_KEYS = frozenset({ENDED_STATE, RESET, RESET_INFO})  # what "restart" adds to a reset env's step info

# asynchronous="idle" and None, align="item": True for the envs whose result is a None result. The tensor
# backend sets it, with its mask, on every step of such a policy.
IDLE = "idle"

# The id of each env of the results: always in recv()'s, and in a step's or reset's where some env failed
# (the results an EnvError carries). The Tianshou view sets it every step; the SB3 view takes it out.
ENV_ID = "env_id"

# on_worker_failure / on_env_error="restart" / recycle: an env rebuilt answers with a new episode's first
# obs, truncated=True, reward 0, and says why.
WORKER_RESTARTED = "worker_restarted"  # its worker died, hung past call_timeout or was recycled
ENV_RESTARTED = "env_restarted"  # its step raised (on_env_error="restart")
FAILURE = "failure"  # beside either: the healing.SurvivedFailure that cut the episode
FAILURE_KEYS = (WORKER_RESTARTED, ENV_RESTARTED, FAILURE)

# The Gymnasium view, AutoresetMode.SAME_STEP (Gymnasium's names): an object array of the last obs of each
# episode that ended in the step (None for the other envs), and those envs' last step info.
FINAL_OBS = "final_obs"
FINAL_INFO = "final_info"

# The SB3 view (SB3's names), in each env's info dict: the last obs of the episode that ended in the step,
# for each env done in it; and in every env's info of every step, truncated and not terminated.
TERMINAL_OBSERVATION = "terminal_observation"
TIMELIMIT_TRUNCATED = "TimeLimit.truncated"

LIBRARY_KEYS = frozenset({  # every key above: what the library may write into an info
    ENDED_STATE, RESET, RESET_INFO, IDLE, ENV_ID, WORKER_RESTARTED, ENV_RESTARTED, FAILURE,
    FINAL_OBS, FINAL_INFO, TERMINAL_OBSERVATION, TIMELIMIT_TRUNCATED,
})

# The masks the library spells itself (the views' are made by Gymnasium's own merge).
ENDED_STATE_MASK = MASK_PREFIX + ENDED_STATE
RESET_MASK = MASK_PREFIX + RESET
IDLE_MASK = MASK_PREFIX + IDLE
ENV_ID_MASK = MASK_PREFIX + ENV_ID
WORKER_RESTARTED_MASK = MASK_PREFIX + WORKER_RESTARTED
ENV_RESTARTED_MASK = MASK_PREFIX + ENV_RESTARTED
