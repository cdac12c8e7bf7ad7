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

import copyreg
import functools
import io
import pickle
from collections import ChainMap
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

from parallelenv.backends import pickling

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


@functools.lru_cache(maxsize=1024)  # a snapshot step names every env's class
def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def trust(env_class: str) -> None:
    """Take ``env_class``'s pickle as its state from now on, in this process (check_state does, on a pass)."""
    _TRUSTED_PICKLES.add(env_class)


def trusted_classes() -> frozenset[str]:
    return frozenset(_TRUSTED_PICKLES)


@functools.cache
def _class_way(cls: type) -> str | None:
    """The way a class says (its protocol, an adapter's base), without importing MuJoCo or the ALE."""
    if callable(getattr(cls, "get_state", None)) and callable(getattr(cls, "set_state", None)):
        return PROTOCOL
    bases = {class_name(base) for base in cls.__mro__}
    return MUJOCO if "gymnasium.envs.mujoco.mujoco_env.MujocoEnv" in bases else \
        ALE if "ale_py.env.AtariEnv" in bases else None


def _has_protocol(obj: Any) -> bool:
    return _class_way(type(obj)) == PROTOCOL


def way_of(env: Any, trusted: Iterable[str] = ()) -> str:
    """How ``env``'s state is taken (see the module's docstring); a StateError where it cannot be."""
    return _way_of_core(env.unwrapped, trusted)


def _way_of_core(core: Any, trusted: Iterable[str]) -> str:
    way = _class_way(type(core))
    if way in (PROTOCOL, MUJOCO):
        return way
    if way == ALE:
        sticky = core.ale.getFloat("repeat_action_probability")
        if sticky > 0:
            raise StateError(
                f"{class_name(type(core))} repeats its last action at random (repeat_action_probability={sticky:g}), "
                "and the ALE's cloneState does not keep which action that is: a state put back would not go on "
                "exactly. Make the env with repeat_action_probability=0 (v5 envs default to 0.25)"
            )
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


# What an env or wrapper was built with, which an env built the same way holds already: its metadata,
# spaces and spec (a wrapper's own are None where it keeps its inner env's), and the constructor's
# arguments that Gymnasium keeps to pickle it (RecordConstructorArgs' and EzPickle's); the env-state page
# says how much of a state that is. Any other space, spec or env an attribute holds is left out by its type.
_BUILT_WITH = frozenset({"metadata", "_metadata", "action_space", "observation_space", "_action_space",
                         "_observation_space", "spec", "_cached_spec", "_saved_kwargs", "_ezpickle_args",
                         "_ezpickle_kwargs"})


def _attributes(obj: Any, leave_out: frozenset[str] = _BUILT_WITH) -> dict[str, Any]:
    """``obj``'s own attributes that its next steps may depend on: not the envs it holds (a wrapper's
    inner env is not its state), nor its spaces, spec and what else it was built with (``_BUILT_WITH``),
    which stay what they were built as (a space's own generator, for ``space.sample()``, is the caller's,
    not the env's). Its arrays and generators are pickled by :func:`_dumps`'s reductions."""
    own = vars(obj)
    kept = dict(own)
    for name in leave_out.intersection(own):
        del kept[name]
    # Most attributes are taken as they are, their types seen before: they are looked at one by one only
    # where one of a new type is among them.
    kinds = set(map(type, kept.values()))
    if kinds <= _KEPT_KINDS:
        return kept
    for kind in kinds - _KEPT_KINDS:
        if not issubclass(kind, (gym.Env, gym.Space, EnvSpec)):
            _KEPT_KINDS.add(kind)
    return {name: value for name, value in kept.items() if type(value) in _KEPT_KINDS}


# The types of attribute values seen that are taken (not envs, spaces or specs).
_KEPT_KINDS: set[type] = set()


def _put_attributes(obj: Any, attributes: dict[str, Any]) -> None:
    own = vars(obj)
    for name, value in attributes.items():
        held = own.get(name)
        if type(value) is np.random.Generator and type(held) is np.random.Generator and \
                type(held.bit_generator) is type(value.bit_generator):
            # Into the generator there is: whatever else holds it (a wrapper, a space) goes on with it.
            held.bit_generator.state = value.bit_generator.state
        else:
            own[name] = value


# The dtypes that their ``str`` names whole and whose bytes are the values: booleans, numbers, fixed-size
# strings and bytes, dates and durations.
_PLAIN_KINDS = frozenset("biufcSUmM")


def _reduce_array(array: np.ndarray) -> tuple[Any, ...]:
    # Its bytes, dtype and shape pickle several times faster than the array itself (a snapshot step
    # takes every env's state: see the env-state page's cost table).
    dtype = array.dtype
    if dtype.kind not in _PLAIN_KINDS or dtype.fields is not None:  # objects, records, NumPy's StringDType
        return array.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    return _array, (array.tobytes(), array.dtype.str, array.shape)


def _array(data: bytes, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _reduce_generator(generator: np.random.Generator) -> tuple[Any, ...]:
    # Its state alone, far less to pickle than the generator.
    return _generator, (generator.bit_generator.state,)


def _generator(state: dict[str, Any]) -> np.random.Generator:
    generator = np.random.Generator(getattr(np.random, state["bit_generator"])())
    generator.bit_generator.state = state
    return generator


_STATE_REDUCTIONS = {np.ndarray: _reduce_array, np.random.Generator: _reduce_generator}


class _Reductions(dict):
    """The state's reductions, then copyreg's, looked up by the C pickler at C speed for its own types (a
    ChainMap would run Python code for every array and generator)."""

    def __missing__(self, kind: type) -> Any:
        return copyreg.dispatch_table[kind]


class _StatePickler(pickle.Pickler):
    dispatch_table = _Reductions(_STATE_REDUCTIONS)


class _CloudStatePickler(pickling.Pickler):
    dispatch_table = ChainMap(_STATE_REDUCTIONS, pickling.Pickler.dispatch_table)


def _dumps(value: Any, reduced: bool = False) -> bytes:
    """The standard pickle where it serves (a state is small, and it is the cheaper), else the
    project's cloudpickle (:mod:`parallelenv.backends.pickling`), which takes what the user's script
    defines; ``reduced``: with the state's reductions of arrays and generators (the adapters' and
    wrappers' attributes; a whole env's pickle is NumPy's own)."""
    try:
        if not reduced:
            return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        with io.BytesIO() as file:
            _StatePickler(file, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
            return file.getvalue()
    except Exception:  # noqa: BLE001  (a lambda, a class defined in a function: cloudpickle takes those)
        return pickling.dumps(value, _CloudStatePickler if reduced else None)


_INNER_ENV = _BUILT_WITH | {"env"}
_SIMULATOR_HANDLES = {MUJOCO: _BUILT_WITH | {"model", "data", "mujoco_renderer"}, ALE: _BUILT_WITH | {"ale"}}


def _core_state(core: Any, way: str) -> Any:
    if way == PROTOCOL:
        return core.get_state()
    if way == MUJOCO:
        import mujoco

        spec, model, data = mujoco.mjtState.mjSTATE_INTEGRATION, core.model, core.data
        integration = np.empty(mujoco.mj_stateSize(model, spec))
        mujoco.mj_getState(model, data, integration, spec)
        # The integration state, then the bodies' positions as the last step computed them (from before
        # it integrated), which no integration state holds: Ant's and Humanoid's rewards read them before
        # their next step. Both kinds of positions are C-ordered float64, as the integration state is.
        simulator = integration.tobytes() + data.xpos.tobytes() + data.xipos.tobytes()
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

        data, spec = core.data, mujoco.mjtState.mjSTATE_INTEGRATION
        values = np.frombuffer(simulator, dtype=np.float64)
        size = mujoco.mj_stateSize(core.model, spec)
        if values.size != size + data.xpos.size + data.xipos.size:
            raise StateError(f"this state is of a MuJoCo model of another size ({values.size} values, this "
                             f"one takes {size + data.xpos.size + data.xipos.size})")
        data.xpos[...] = values[size:size + data.xpos.size].reshape(data.xpos.shape)
        data.xipos[...] = values[size + data.xpos.size:].reshape(data.xipos.shape)
        mujoco.mj_setState(core.model, data, values[:size].copy(), spec)
    else:
        core.ale.restoreState(simulator)
    _put_attributes(core, attributes)


def capture_env(env: Any, trusted: Iterable[str] = ()) -> EnvState:
    """The state of ``env``, a Gymnasium env with its wrappers. ``trusted``: env classes whose pickle
    the caller's process has checked (a worker process has its own, empty, record)."""
    wrappers = _layers(env)
    core = (wrappers[-1].env if wrappers else env).unwrapped
    way = _way_of_core(core, trusted)
    cls = class_name(type(core))
    if way == PICKLE:
        return EnvState(PICKLE, cls, _dumps(env))
    layers = [(True, layer.get_state()) if _has_protocol(layer) else (False, _attributes(layer, _INNER_ENV))
              for layer in wrappers]
    core_state = _core_state(core, way)
    try:
        data = _dumps((layers, core_state), reduced=True)
    except Exception as exc:
        raise StateError(f"the state of {cls} (its wrappers {[type(w).__name__ for w in wrappers]}) "
                         f"does not pickle: {type(exc).__name__}: {exc}") from exc
    return EnvState(way, cls, data)


def captured(env: Any, trusted: Iterable[str]) -> EnvState | str:
    """``env``'s state, or why it cannot be taken (a snapshot taken with a step never fails the step)."""
    try:
        return capture_env(env, trusted)
    except StateError as refused:
        return str(refused)
    except Exception as exc:  # noqa: BLE001  (an env's own get_state that raises: the step goes on without it)
        return f"taking its state raised {type(exc).__name__}: {exc}"


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
            _put_attributes(layer, layer_state)
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

