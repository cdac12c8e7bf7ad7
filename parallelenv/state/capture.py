"""One env's state as a value: taken where the env runs, put back into it or into a fresh one.

An env's state is everything its next steps depend on: its simulator, its
random generators and its wrappers' counters. It is taken the first way
that holds, in this order:

1. **protocol**: the env (its unwrapped core) has ``get_state()`` and
   ``set_state(state)`` of its own;
2. **mujoco** / **ale**: an adapter for Gymnasium's MuJoCo envs
   (``mj_getState`` of the integration state) and the ALE's Atari envs
   (``cloneState(include_rng=True)``), the core's other attributes (its
   ``np_random`` among them) beside it;
3. **pickle**: the whole env, pickled, for an env class whose pickle
   :func:`~parallelenv.state.check_state` has seen continue exactly in this
   process (an env class that pickles its constructor's arguments, as
   MuJoCo's do, comes back as a fresh env: never trusted by default);
4. else a :class:`StateError` that names the env's class and what to implement.

Outside the pickle way each wrapper keeps its own state: its ``get_state``
and ``set_state`` where it has them, else its attributes (TimeLimit's
elapsed steps, RecordEpisodeStatistics' sums). The tensor backend's envs are
rows of one :class:`~parallelenv.tensor.TensorEnv`: see its ``get_state``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

__all__ = ["EnvState", "StateError", "capture_env", "class_name", "restore_env", "trust", "trusted_classes"]

PROTOCOL, MUJOCO, ALE, PICKLE, TENSOR = "protocol", "mujoco", "ale", "pickle", "tensor"

# The classes whose pickle continues exactly, as check_state found in this process.
_TRUSTED_PICKLES: set[str] = set()


class StateError(TypeError):
    """An env's state cannot be taken or put back (the message says which env and why)."""


@dataclass(frozen=True)
class EnvState:
    """One env's state: opaque bytes, picklable and reusable, put back with ``set_state``.

    ``way`` says how it was taken (``"protocol"``, ``"mujoco"``, ``"ale"``,
    ``"pickle"`` or ``"tensor"``); ``env_class`` is the class of the env it
    belongs to, checked when it is put back.
    """

    way: str
    env_class: str
    data: bytes

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return f"EnvState(way={self.way!r}, env_class={self.env_class!r}, {self.nbytes} bytes)"


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def trust(env_class: str) -> None:
    """Take ``env_class``'s pickle as its state from now on, in this process (check_state does, on a pass)."""
    _TRUSTED_PICKLES.add(env_class)


def trusted_classes() -> frozenset[str]:
    return frozenset(_TRUSTED_PICKLES)


def _in_mro(cls: type, qualified: str) -> bool:
    return any(class_name(base) == qualified for base in cls.__mro__)


def _is_mujoco(core: Any) -> bool:
    return _in_mro(type(core), "gymnasium.envs.mujoco.mujoco_env.MujocoEnv")


def _is_ale(core: Any) -> bool:
    return _in_mro(type(core), "ale_py.env.AtariEnv")


def _has_protocol(obj: Any) -> bool:
    return callable(getattr(type(obj), "get_state", None)) and callable(getattr(type(obj), "set_state", None))


def way_of(env: Any, trusted: Iterable[str] = ()) -> str:
    """How ``env``'s state is taken (see the module's docstring); a StateError where it cannot be."""
    core = env.unwrapped
    if _has_protocol(core):
        return PROTOCOL
    if _is_mujoco(core):
        return MUJOCO
    if _is_ale(core):
        return ALE
    cls = class_name(type(core))
    if cls in _TRUSTED_PICKLES or cls in trusted:
        return PICKLE
    raise StateError(
        f"{cls} has no get_state()/set_state() and no adapter here (MuJoCo and ALE envs have one): give the "
        "class get_state() returning a picklable value and set_state(state) putting it back, or run "
        "parallelenv.check_state(make_env) once in this process to verify, and then trust, its pickle"
    )


def _layers(env: Any) -> list[Any]:
    """The wrappers around ``env``'s core, outermost first."""
    layers = []
    while isinstance(env, gym.Wrapper):
        layers.append(env)
        env = env.env
    return layers


def _attributes(obj: Any, leave_out: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``obj``'s own attributes but the envs it holds (a wrapper's inner env is not its state)."""
    return {name: value for name, value in vars(obj).items()
            if name not in leave_out and not isinstance(value, gym.Env)}


_SIMULATOR_HANDLES = {MUJOCO: frozenset({"model", "data", "mujoco_renderer"}), ALE: frozenset({"ale"})}


def _core_state(core: Any, way: str) -> Any:
    if way == PROTOCOL:
        return core.get_state()
    if way == MUJOCO:
        import mujoco

        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        simulator = np.empty(mujoco.mj_stateSize(core.model, spec))
        mujoco.mj_getState(core.model, core.data, simulator, spec)
    else:
        simulator = core.ale.cloneState(include_rng=True)
    return simulator, _attributes(core, _SIMULATOR_HANDLES[way])


def _put_core_state(core: Any, way: str, state: Any) -> None:
    if way == PROTOCOL:
        core.set_state(state)
        return
    simulator, attributes = state
    if way == MUJOCO:
        import mujoco

        mujoco.mj_setState(core.model, core.data, simulator, mujoco.mjtState.mjSTATE_INTEGRATION)
    else:
        core.ale.restoreState(simulator)
    vars(core).update(attributes)


def capture_env(env: Any, trusted: Iterable[str] = ()) -> EnvState:
    """The state of ``env``, a Gymnasium env with its wrappers. ``trusted``: env classes whose pickle
    the caller's process has checked (a worker process has its own, empty, record)."""
    way = way_of(env, trusted)
    cls = class_name(type(env.unwrapped))
    if way == PICKLE:
        return EnvState(PICKLE, cls, cloudpickle.dumps(env))
    layers = [(True, layer.get_state()) if _has_protocol(layer) else (False, _attributes(layer, frozenset({"env"})))
              for layer in _layers(env)]
    try:
        data = cloudpickle.dumps((layers, _core_state(env.unwrapped, way)))
    except Exception as exc:
        raise StateError(f"the state of {cls} (its wrappers {[type(w).__name__ for w in _layers(env)]}) "
                         f"does not pickle: {type(exc).__name__}: {exc}") from exc
    return EnvState(way, cls, data)


def restore_env(env: Any, state: EnvState) -> None:
    """Put ``state`` back into ``env`` (the same env, or another built the same way), in place."""
    if not isinstance(state, EnvState):
        raise TypeError(f"a state is an EnvState from get_state(), not {type(state).__name__}")
    cls = class_name(type(env.unwrapped))
    if state.env_class != cls:
        raise StateError(f"this state is of a {state.env_class}, and this env is a {cls}")
    layers = _layers(env)
    if state.way == PICKLE:
        _take_contents(env, layers, cloudpickle.loads(state.data))
        return
    layer_states, core_state = cloudpickle.loads(state.data)
    if len(layer_states) != len(layers):
        raise StateError(f"this state is of a {cls} in {len(layer_states)} wrappers, and this one has {len(layers)}")
    for layer, (own_protocol, layer_state) in zip(layers, layer_states, strict=True):
        if own_protocol:
            layer.set_state(layer_state)
        else:
            vars(layer).update(layer_state)
    _put_core_state(env.unwrapped, state.way, core_state)


def _take_contents(env: Any, layers: list[Any], copy: Any) -> None:
    """Make each layer of ``env`` hold what the same layer of ``copy`` holds: the objects stay the
    user's (their references keep working), their contents become the copy's."""
    copies = [*_layers(copy), copy.unwrapped]
    originals = [*layers, env.unwrapped]
    if [type(c) for c in copies] != [type(o) for o in originals]:
        raise StateError(f"this state's wrappers {[type(c).__name__ for c in copies]} are not this env's "
                         f"{[type(o).__name__ for o in originals]}")
    for original, copied in zip(originals, copies, strict=True):
        inner = vars(original).get("env")
        vars(original).clear()
        vars(original).update(vars(copied))
        if inner is not None:
            original.env = inner

