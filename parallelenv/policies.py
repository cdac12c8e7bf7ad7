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

from typing import Any

from gymnasium.vector import AutoresetMode


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
    """When any env finishes, every env is finished until reset (``asynchronous=None``)."""

    name = None
    tracks_finished = True
    ends_all = True
    _autoreset_mode = None

    def after_step(self, finished: Any, ids: Any, done: Any) -> None:
        # `|= done.any()` rather than `if done.any()`: no host sync for tensors.
        finished |= done.any()


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
