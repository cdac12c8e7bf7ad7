"""What happens to envs that finish at different times.

Each policy is a small strategy object used by every backend. The
``asynchronous=`` string becomes one of these objects once, in the
ParallelEnv's ``__init__`` (:func:`resolve_policy`); everything else asks the
object, never the string. The part that runs next to the env (resetting a
finished env in the same step) is a flag read by the env host; the part that
spans envs (which envs are finished and get None results) is kept by the
front object in a boolean ``finished`` mask. The mask operations are plain
indexing, so the same code runs over NumPy arrays and over torch tensors
without synchronising with the host.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from parallelenv.errors import AllEnvsFinishedWarning, warn_at_user_call


class Policy:
    """Base policy: every env is stepped, nothing is tracked ("continue").

    Policies are module singletons (see :data:`POLICIES`); one pickles as a
    reference to its name, so a copy sent to a worker process or a Ray actor
    is the same object there.

    Example:
        >>> from parallelenv.policies import resolve_policy
        >>> policy = resolve_policy("idle")
        >>> policy.tracks_finished, policy.restarts_finished_envs, policy.ends_all
        (True, False, False)
        >>> policy.autoreset_mode()
        <AutoresetMode.NEXT_STEP: 'NextStep'>
    """

    name: str | None = "continue"
    #: The env host resets an env in the step that finishes it.
    restarts_finished_envs = False
    #: Some envs may be finished and answer with None results.
    tracks_finished = False
    #: One env finishing finishes every env (until reset).
    ends_all = False
    #: Gymnasium's name for what happens to a finished env (None: Gymnasium has none).
    _autoreset_mode: AutoresetMode | None = AutoresetMode.NEXT_STEP

    def live(self, finished: Any, ids: Any) -> Any:
        """Mask over ``ids`` of the envs that really step (the rest get None results)."""
        return ~finished[ids]

    def after_step(self, finished: Any, ids: Any, done: Any) -> None:
        """Update ``finished`` in place after ``ids`` stepped and ``done`` says which ended."""

    def autoreset_mode(self) -> AutoresetMode:
        """The Gymnasium autoreset mode of this policy, or a ValueError saying which policies have one."""
        if self._autoreset_mode is None:
            raise ValueError(
                f"asynchronous={self.name!r} has no Gymnasium autoreset mode: when one env finishes it finishes "
                "them all. Use asynchronous='restart' (SAME_STEP), or 'idle' or 'continue' (NEXT_STEP)"
            )
        return self._autoreset_mode

    def __repr__(self) -> str:
        return f"<policy {self.name!r}>"

    def __reduce__(self) -> tuple[Any, tuple[str | None]]:
        return resolve_policy, (self.name,)


class Continue(Policy):
    """Every env receives its action and returns its result, done or not."""


class Restart(Policy):
    """A finished env is reset at once; its last obs goes to ``info["ended_state"]``."""

    name = "restart"
    restarts_finished_envs = True
    _autoreset_mode = AutoresetMode.SAME_STEP


class Idle(Policy):
    """Finished envs are not stepped and return None results until reset."""

    name = "idle"
    tracks_finished = True

    def after_step(self, finished: Any, ids: Any, done: Any) -> None:
        finished[ids] |= done


class AllFinish(Policy):
    """When any env finishes, every env is finished until reset (``asynchronous=None``).

    The first step that then finds every env finished gives an
    :class:`~parallelenv.errors.AllEnvsFinishedWarning` naming the envs that
    ended the episode and the policies that keep the others running: it
    returns None results only, which a loop not written for this policy reads
    as zero rewards and endless terminations. Once per ending: after a
    ``reset()`` the next ending that a step runs past warns again. A loop that
    resets when an env finishes never sees it. Masks on an accelerator are not
    read for it, since that would make each step wait for the device.
    """

    name = None
    tracks_finished = True
    ends_all = True
    _autoreset_mode = None

    def __init__(self) -> None:
        # Per ParallelEnv, by its finished mask (which lives exactly as long as its call tracker):
        # the envs that ended the last episode, and whether a step past that end has warned.
        self._endings: dict[int, list[Any]] = {}

    def live(self, finished: Any, ids: Any) -> Any:
        ending = self._endings.get(id(finished)) if self._endings else None
        if ending is not None and not ending[1] and finished.all():
            ending[1] = True
            warn_at_user_call(_stepped_past_the_end(ending[0]), AllEnvsFinishedWarning)
        return ~finished[ids]

    def after_step(self, finished: Any, ids: Any, done: Any) -> None:
        if _on_host(finished) and done.any():
            self._ended(finished, _env_indices(finished, ids, done))
        # `|= done.any()` rather than `if done.any()`: no host sync for tensors.
        finished |= done.any()

    def _ended(self, finished: Any, ended_by: list[int]) -> None:
        key = id(finished)
        ending = self._endings.get(key)
        if not finished.all():  # these envs end every env's episode
            if ending is None:
                weakref.finalize(finished, self._endings.pop, key, None)
            self._endings[key] = [ended_by, False]
        elif ending is not None and not ending[1]:
            # Other hosts' answers to the same step (finished envs are not stepped until reset).
            ending[0] = sorted({*ending[0], *ended_by})


def _on_host(mask: Any) -> bool:
    """Whether reading ``mask`` costs no wait for a device (NumPy, or a torch tensor on the CPU)."""
    return str(getattr(mask, "device", "cpu")) == "cpu"


def _env_indices(finished: Any, ids: Any, done: Any) -> list[int]:
    """The indices of the envs of ``ids`` (rows of ``finished``) where ``done`` is set."""
    mask = finished & False
    mask[ids] = done
    positions = mask.nonzero()[0] if isinstance(mask, np.ndarray) else mask.nonzero()[:, 0]
    return [int(i) for i in positions.tolist()]


def _stepped_past_the_end(ended_by: list[int]) -> str:
    envs = f"env {ended_by[0]}" if len(ended_by) == 1 else f"envs {ended_by}"
    return (
        f"every env is finished: {envs} finished in an earlier step, and under asynchronous=None one env "
        "finishing finishes all of them. This step and every later one return None results (zero obs and "
        "reward, terminated=True, info['idle']) without stepping any env, until reset(). To keep the other "
        "envs running, pass asynchronous='restart' (a finished env starts its next episode in the same step) "
        "or 'idle' (only the finished envs stop)"
    )


POLICIES: dict[str | None, Policy] = {
    None: AllFinish(),
    "idle": Idle(),
    "restart": Restart(),
    "continue": Continue(),
}


def resolve_policy(asynchronous: str | None) -> Policy:
    """Turn the ``asynchronous=`` argument into its policy, or say which names are valid."""
    try:
        return POLICIES[asynchronous]
    except (KeyError, TypeError):
        valid = ", ".join(repr(name) for name in POLICIES)
        raise ValueError(f"asynchronous={asynchronous!r} is not a policy; use one of {valid}") from None
