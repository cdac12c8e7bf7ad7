"""The calls a ParallelEnv makes on its envs besides reset and step: attributes, methods, replacements.

:class:`EnvCalls` is the part of :class:`~parallelenv.ParallelEnv` that
builds these calls; each runs on the envs of ``id`` through the front's
``_selection`` and ``_values``, one caller at a time, and raises an
:class:`~parallelenv.EnvError` naming the envs whose call raised.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from parallelenv import arguments
from parallelenv.array_kinds import Selection
from parallelenv.calls import NO_ARGUMENT, Call, CallMethod, GetAttr, ReplaceEnv, SetAttr
from parallelenv.serialised import one_caller_at_a_time


class EnvCalls:
    """Attribute, method and replacement calls on the envs of ``id`` (see the module's docstring)."""

    def _selection(self, id: Any) -> Selection:
        raise NotImplementedError

    def _values(self, call: Call, selection: Selection) -> list[Any]:
        raise NotImplementedError

    @one_caller_at_a_time
    def get_env_attr(self, name: str, id: Any = None) -> list[Any]:
        """The attribute ``name`` of each env of ``id`` (None where an env has none)."""
        selection = self._selection(id)
        return self._values(GetAttr(selection.env_ids, arguments.attribute_name(name)), selection)

    @one_caller_at_a_time
    def set_env_attr(self, name: str, value: Any, id: Any = None) -> None:
        """Set the attribute ``name`` to ``value`` on every env of ``id``."""
        selection = self._selection(id)
        self._values(SetAttr(selection.env_ids, arguments.attribute_name(name), value), selection)

    @one_caller_at_a_time
    def customized_method(self, name: str | Callable[..., Any], data: Any = None, id: Any = None) -> list[Any]:
        """Call the env method ``name`` on each env of ``id``; returns their return values.

        Args:
            name: a method name, or a function called as ``name(env, ...)``
                where the env runs (it travels with cloudpickle to process and
                Ray backends), with the arguments a method would get.
            data: None to call without arguments, or a list with one entry per
                env of ``id``, in its order. A dict entry is that env's keyword
                arguments: ``{"x": 1, "y": 2}`` calls ``env.name(x=1, y=2)``.
                Any other entry is passed as the single positional argument
                (to pass a dict positionally, give
                ``parallelenv.calls.Arguments((the_dict,))``). The tensor
                backend calls its batched env once for all the envs of
                ``id``: ``env.name(ids)`` with an index tensor, the keyword
                dicts batched per keyword (``env.name(ids, x=[...])``), other
                entries as one list (``env.name(ids, data)``).
            id: env indices; results come back in this order.

        Example:
            >>> import gymnasium as gym
            >>> from parallelenv import ParallelEnv
            >>> with ParallelEnv([lambda: gym.make("CartPole-v1")] * 4) as penv:
            ...     penv.customized_method("has_wrapper_attr", data=[{"name": "gravity"}, {"name": "mass"}], id=[3, 1])
            [True, False]
        """
        selection = self._selection(id)
        per_env = (NO_ARGUMENT,) * len(selection) if data is None else arguments.per_env(data, selection.ids, "data")
        method = name if callable(name) else arguments.attribute_name(name)
        return self._values(CallMethod(selection.env_ids, method, per_env), selection)

    @one_caller_at_a_time
    def replace_envs(self, envs: Any, id: Any = None) -> None:
        """Close the envs of ``id`` and put new ones in their place, where they run.

        The new envs must have the spaces of the old ones, and need a
        :meth:`reset` before their first step.

        Args:
            envs: one ``gym.Env`` or zero-argument factory per env of ``id``;
                factories are built in the worker (or actor) hosting the env.
            id: the envs to replace.

        Example:
            >>> import gymnasium as gym
            >>> from parallelenv import ParallelEnv
            >>> with ParallelEnv.make("CartPole-v1", num_envs=2, para_mode="dummy") as penv:
            ...     penv.replace_envs([lambda: gym.make("CartPole-v1", max_episode_steps=50)], id=[1])
            ...     obs, info = penv.reset(seed=0, id=[1])
            ...     penv.get_env_attr("spec", id=[1])[0].max_episode_steps
            50
        """
        selection = self._selection(id)
        sources = arguments.per_env(envs, selection.ids, "envs")
        self._values(ReplaceEnv(selection.env_ids, sources), selection)
