"""The two shapes of results: batched (``align="item"``) and per env (``align="batch"``).

*None results* (envs the policy has finished) are filled in here, from the
mask the front object passes, without ever calling into those envs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from parallelenv.array_kinds import NumpyArrays, Selection
from parallelenv.batching import Batched, unbatch
from parallelenv.calls import Failure
from parallelenv.infos.keys import ENDED_STATE, ENDED_STATE_MASK, ENV_ID, ENV_ID_MASK, RESET, RESET_MASK
from parallelenv.infos.step_infos import StepInfo

NONE_RESULT: tuple[Any, ...] = (None, None, True, False, {})

StepArrays = tuple[np.ndarray, np.ndarray, np.ndarray]  # reward, terminated, truncated


@dataclass(slots=True)
class Received:
    """What the replies said of the envs handed over, besides the buffers' rows."""

    info: StepInfo  # the envs' infos, whatever road they took
    none_result: Any  # mask over them of None results (None: the policy gives none)
    # Under "restart", with Buffers.ended: mask over them of the envs reset because their episode
    # ended, and a row each with those episodes' last obs (zeros elsewhere); None when none ended.
    ended: np.ndarray | None = None
    ended_state: np.ndarray | None = None


@dataclass(slots=True)
class Outcome:
    """What a call handed over: the envs that answered, what they answered, and the failures of the others.

    A step or reset fills ``results`` (obs, and for a step reward, terminated
    and truncated, in the order of ``answered``) and ``received``; any other
    call fills ``values``, each env's answer.
    """

    answered: Selection
    failures: list[Failure]
    received: Received | None = None
    results: tuple[Any, ...] | None = None
    values: dict[int, Any] | None = None  # None for a step: no env answers with a value


def shaped(outcome: Outcome, align: str, with_env_id: bool, arrays: NumpyArrays) -> Any:
    """The results of a step, recv or reset's ``outcome`` as ``align`` shapes them; None where no env
    answered. ``with_env_id``: ``info["env_id"]`` says which envs answered (always beside failures)."""
    results = outcome.results
    if results is None:
        return None
    answered = outcome.answered.ids
    env_ids = answered if with_env_id or outcome.failures else None
    assemble = batch_results if align == "batch" else item_results
    return assemble(results[0], results[1:] or None, answered, outcome.received, arrays, env_ids=env_ids)


def add_ended(received: Received, ended: np.ndarray | None, ended_obs: Any, selection: Selection) -> None:
    """The episodes that ended in the step of ``selection`` handed over, out of the buffers' rows
    of ended episodes (``Buffers.ended``, ``Buffers.ended_obs``), if any."""
    if ended is None:
        return
    mask = ended if selection.everyone else ended[selection.rows]
    if not np.count_nonzero(mask):  # cheaper than mask.any() on a few envs
        return
    # Row by row: few episodes end in a step, and NumPy's boolean and fancy
    # indexing cost several times a row's copy on small observations.
    states = np.zeros((len(mask), *ended_obs.shape[1:]), dtype=ended_obs.dtype)
    rows = None if selection.everyone else selection.ids
    for position in mask.nonzero()[0].tolist():
        states[position] = ended_obs[position if rows is None else rows[position]]
    received.ended, received.ended_state = mask.copy(), states


def item_results(
    obs: Batched,
    step_arrays: StepArrays | None,
    ids: np.ndarray,
    received: Received,
    arrays: NumpyArrays,
    env_ids: np.ndarray | None = None,
) -> Any:
    """``(obs, info)`` after a reset (no ``step_arrays``), else ``(obs, reward, terminated, truncated, info)``."""
    n = len(ids)
    info = received.info.vector(ids)
    if received.ended is not None:
        ended = received.ended
        info[ENDED_STATE], info[ENDED_STATE_MASK] = received.ended_state, ended
        info[RESET], info[RESET_MASK] = ended.copy(), ended.copy()
    if env_ids is not None:
        info[ENV_ID], info[ENV_ID_MASK] = env_ids.copy(), np.ones(n, dtype=bool)
    if step_arrays is None:
        return obs, info
    if received.none_result is not None:
        arrays.fill_none_results(obs, step_arrays, info, received.none_result)
    return (obs, *step_arrays, info)


def batch_results(
    obs: Batched,
    step_arrays: StepArrays | None,
    ids: np.ndarray,
    received: Received,
    arrays: NumpyArrays,
    env_ids: np.ndarray | None = None,
) -> list[tuple[Any, ...]]:
    """Per env ``(obs, info)`` after a reset (no ``step_arrays``), else ``(obs, reward, terminated, truncated, info)``."""
    results: list[tuple[Any, ...]] = []
    if step_arrays is not None:
        reward, terminated, truncated = (arrays.to_list(a) for a in step_arrays)
    none_result = [False] * len(ids) if received.none_result is None else arrays.to_list(received.none_result)
    ended = [False] * len(ids) if received.ended is None else received.ended.tolist()
    step_info = received.info
    for p, i in enumerate(ids.tolist()):
        info = step_info.env_info(p, i)
        if ended[p]:
            info = {**info, ENDED_STATE: received.ended_state[p], RESET: True}
        if env_ids is not None:
            info = {**info, ENV_ID: i}
        if step_arrays is None:
            results.append((unbatch(obs, p), info))
        elif none_result[p]:
            results.append(NONE_RESULT[:4] + (info if env_ids is not None else {},))
        else:
            results.append((unbatch(obs, p), reward[p], terminated[p], truncated[p], info))
    return results
