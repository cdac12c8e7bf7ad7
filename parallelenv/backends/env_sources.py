"""The envs of the CPU backends, from the user's env instances and factories.

Checked where the user gave them, pickled for a worker process or actor,
and built in the process that runs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from parallelenv.backends import pickling
from parallelenv.calls import Failure
from parallelenv.errors import SharedEnvError

EnvSource = Any  # a gym.Env, or a zero-argument callable returning one


def env_list(envs: Any) -> list[EnvSource]:
    """The user's ``envs`` as a list of env sources, checked where the user gave them.

    A TypeError says what a CPU backend takes. One env instance given as two
    entries (also under other wrappers) is a
    :class:`~parallelenv.errors.SharedEnvError` (a ValueError of ours: no env
    raised it), raised before any env is sent anywhere: a process backend
    would pickle each entry on its own, and the copies would hide it. Factories cannot be compared here: their envs
    exist once called, which a process backend does in its workers, each on
    its own unpickled copy of the factory. There an env that several
    factories share arrives as copies, each its own env; it is refused where
    one process builds it twice (a factory returning a module-level env).
    """
    sources = _source_list(envs)
    given: dict[int, int] = {}
    for env_id, source in enumerate(sources):
        if isinstance(source, gym.Env):
            refuse_shared_env(source, env_id, given)
    return sources


def _source_list(envs: Any) -> list[EnvSource]:
    refuse_env_ids(envs)
    if isinstance(envs, gym.Env) or not isinstance(envs, Sequence) or not envs:
        raise TypeError(f"envs must be a non-empty list of gym.Env instances or factories of them, not "
                        f"{type(envs).__name__}")
    return list(envs)


def refuse_env_ids(envs: Any) -> None:
    """A TypeError if ``envs`` is a Gymnasium id, or a list holding one, naming ``ParallelEnv.make``.

    Said where the user gave them, before any process starts: found where an
    env is built, a string read as an env that raised in ``make()``.
    """
    if isinstance(envs, str):
        where, env_id, num_envs = "envs", envs, "N"
        envs_as = ", not a non-empty list of envs or factories"
    elif isinstance(envs, Sequence) and not isinstance(envs, gym.Env):
        found = next(((index, entry) for index, entry in enumerate(envs) if isinstance(entry, str)), None)
        if found is None:
            return
        where, env_id, num_envs = f"envs[{found[0]}]", found[1], str(len(envs))
        envs_as = ""
    else:
        return
    raise TypeError(
        f"{where} is the string {env_id!r}{envs_as}: a string is not an env or a factory of one. To build envs from a "
        f"Gymnasium id, use ParallelEnv.make({env_id!r}, num_envs={num_envs}, para_mode=...); to pass envs, "
        "give gym.Env instances or zero-argument factories (e.g. lambda: gym.make(...))"
    )


def pickle_sources(sources: Sequence[EnvSource]) -> list[bytes]:
    """cloudpickle each env or factory, naming the first that cannot be sent to a worker."""
    payloads = []
    for env_id, source in enumerate(sources):
        try:
            payloads.append(pickling.dumps(source))
        except Exception as exc:
            raise TypeError(
                f"env {env_id} ({source!r}) cannot be pickled to send it to a worker process: "
                f"{type(exc).__name__}: {exc}. Pass a factory that builds the env in the worker."
            ) from exc
    return payloads


def make_envs(sources: Sequence[EnvSource], first_id: int) -> list[gym.Env] | Failure:
    """Build the envs of a group, or describe the first one that failed.

    An env that is another env of the group (the same object, or the same
    env under other wrappers) fails too: stepped once per entry, it would
    give every entry's results from one env.
    """
    sources = _source_list(sources)
    envs: list[gym.Env] = []
    built: dict[int, int] = {}  # id() of each unwrapped env -> the env id it was built as
    for offset, source in enumerate(sources):
        env_id = first_id + offset
        try:
            env = make_env(source)
            refuse_shared_env(env, env_id, built)
        except Exception as exc:
            for made in envs:
                close_quietly(made)
            return Failure.from_exception(env_id, "make", exc)
        envs.append(env)
    return envs


def refuse_shared_env(env: gym.Env, env_id: int, built: dict[int, int]) -> None:
    """Record ``env`` as env ``env_id`` in ``built``, or raise a SharedEnvError naming the env it already is."""
    first = built.setdefault(id(env.unwrapped), env_id)
    if first != env_id:
        raise SharedEnvError(
            f"env {env_id} is the same env instance as env {first} ({env.unwrapped!r}): each entry of envs needs "
            "its own env. Pass factories that build a new env on each call, not one env twice or a factory that "
            "returns the same env every time"
        )


def refuse_instances_to_rebuild(sources: Sequence[EnvSource]) -> None:
    """A ValueError if an env is an instance run where it is: a failed env cannot be rebuilt from itself."""
    instances = [env_id for env_id, source in enumerate(sources) if isinstance(source, gym.Env)]
    if instances:
        raise ValueError(
            f"on_env_error='restart' rebuilds a failed env from its factory, but envs {instances[:8]} are env "
            "instances that run in this process as they are. Pass factories (e.g. lambda: gym.make(...))"
        )


def make_env(source: EnvSource) -> gym.Env:
    """The env of ``source``: the instance itself, or what its factory returns; a TypeError for anything else."""
    if isinstance(source, gym.Env):
        return source
    if not callable(source):
        raise TypeError(f"got a {type(source).__name__}, not a gymnasium.Env or a factory of one")
    env = source()
    if not isinstance(env, gym.Env):
        raise TypeError(f"its factory returned a {type(env).__name__}, not a gymnasium.Env")
    return env


def close_quietly(env: gym.Env) -> None:
    """Close ``env``, whatever its ``close`` raises."""
    try:
        env.close()
    except Exception:  # closing is best effort: the env may be what failed
        pass
