"""Where ``ParallelEnv.make`` sends a keyword argument that is not one of ParallelEnv's own.

One rule, in this order: ParallelEnv's own arguments (``asynchronous``,
``call_timeout``, ...) go to it; a keyword that the backend's factory names in
its signature (``num_workers``, ``start_method``, ``num_actors``, ...) goes to
the backend, as if given in ``backend_options``; the rest go to
``gym.make`` of each env (or to the maker of the backend's own kind of env,
as for ``para_mode="tensor"``). A keyword that neither the backend nor
``gym.make`` takes is refused here, before any worker starts: sent on, it
would fail in every worker as an env error that never mentions the backend.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from parallelenv.backends import resolve_backend


def split(
    env_id: str,
    para_mode: str,
    make_envs: Callable[..., Any] | None,
    kwargs: dict[str, Any],
    backend_options: dict[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(backend options, keyword arguments for each env's make)`` out of what make was given.

    ``kwargs`` holds what is left once ParallelEnv's own arguments are taken;
    ``make_envs`` is the backend's env maker (None: ``gym.make`` of each env).
    Raises TypeError for a keyword that no one takes, or one given twice.
    """
    for_backend = dict(backend_options or {})
    for_envs = {}
    taken_by_backend = backend_keywords(para_mode)
    for name, value in kwargs.items():
        if name not in taken_by_backend:
            for_envs[name] = value
        elif name in for_backend:
            raise TypeError(f"{name} is given twice, as {name}= and in backend_options; give it once")
        else:
            for_backend[name] = value
    if for_envs:  # the env's maker is read only when something may be meant for it
        _refuse_what_no_one_takes(env_id, para_mode, make_envs, for_envs, taken_by_backend)
    return for_backend, for_envs


def backend_keywords(para_mode: str) -> frozenset[str]:
    """The options that the factory of ``para_mode`` names in its signature.

    A factory's ``**options`` adds none: the built-in backends that have one
    (``dummy``, ``tensor``) take no option, and a registered backend whose
    options only its ``**options`` knows gets them through ``backend_options``.
    """
    return _named(resolve_backend(para_mode), leading=2)


def env_keywords(env_id: str, make_envs: Callable[..., Any] | None) -> frozenset[str] | None:
    """The keywords that making one env of ``env_id`` takes; None where any may be right.

    For ``gym.make``: its own (``max_episode_steps``, ``disable_env_checker``),
    the id's registered kwargs, and those of its entry point (the env class's
    ``__init__``, ``render_mode`` among them). None where the entry point takes
    ``**kwargs``, or cannot be read in this process (an id or an env package
    that only the workers have: their ``gym.make`` then says what is wrong).
    """
    if make_envs is not None:
        return _keywords(make_envs, leading=2)
    try:
        spec = gym.spec(env_id)
        creator = spec.entry_point if callable(spec.entry_point) else load_env_creator(spec.entry_point)
    except Exception:  # whatever gym.spec or the entry point's import raises: see the docstring
        return None
    taken = _keywords(creator, leading=0)
    if taken is None:
        return None
    return taken | _named(gym.make, leading=1) | frozenset(spec.kwargs)


def _keywords(function: Callable[..., Any], leading: int) -> frozenset[str] | None:
    """The names ``function`` takes as keywords after its first ``leading`` parameters; None where
    it takes any (``**kwargs``) or its signature cannot be read."""
    try:
        parameters = list(inspect.signature(function).parameters.values())[leading:]
    except (TypeError, ValueError):  # a builtin or an odd callable
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return _names(parameters)


def _named(function: Callable[..., Any], leading: int) -> frozenset[str]:
    """The names ``function`` takes as keywords after its first ``leading`` parameters, its ``**kwargs`` aside."""
    return _names(list(inspect.signature(function).parameters.values())[leading:])


def _names(parameters: list[inspect.Parameter]) -> frozenset[str]:
    return frozenset(p.name for p in parameters
                     if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY))


def _refuse_what_no_one_takes(
    env_id: str,
    para_mode: str,
    make_envs: Callable[..., Any] | None,
    for_envs: dict[str, Any],
    taken_by_backend: frozenset[str],
) -> None:
    taken_by_envs = env_keywords(env_id, make_envs)
    if taken_by_envs is None:
        return
    unknown = sorted(set(for_envs) - taken_by_envs)
    if not unknown:
        return
    given = ", ".join(f"{name}={for_envs[name]!r}" for name in unknown)
    backend = (f"its options, as keywords or in backend_options={{...}}: {', '.join(sorted(taken_by_backend))}"
               if taken_by_backend else "it takes no options, as keywords or in backend_options={...}")
    maker = f"gym.make({env_id!r})" if make_envs is None else f"the {para_mode} env maker for {env_id!r}"
    raise TypeError(
        f"{given} {'is' if len(unknown) == 1 else 'are'} taken neither by para_mode={para_mode!r} ({backend}) "
        f"nor by {maker} (its keywords: {', '.join(sorted(taken_by_envs)) or 'none'})"
    )


def forwarded_signature(penv_class: type) -> tuple[tuple[str, ...], inspect.Signature]:
    """The keyword arguments of ParallelEnv (``penv_class``) that ParallelEnv.make passes on to it, and
    make's signature stating them with their defaults (for help() and IDEs), both read from ``__init__``."""
    options = [
        parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for name, parameter in inspect.signature(penv_class.__init__).parameters.items()
        if parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and name not in ("self", "envs", "para_mode")
    ]
    make = inspect.signature(penv_class.make)
    *leading, backend_options, gym_kwargs = make.parameters.values()
    return tuple(p.name for p in options), make.replace(parameters=[*leading, *options, backend_options, gym_kwargs])
