"""The backend registry: ``para_mode`` names resolved to backend factories.

Built-in backends are registered by import path and imported on first use,
so that ``import parallelenv`` never imports ray or torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Union

from parallelenv.backends.base import Backend, BackendConfig, BackendFactory

__all__ = [
    "Backend", "BackendConfig", "BackendFactory", "register_backend", "resolve_backend", "backend_names", "env_maker",
]

_REGISTRY: dict[str, Union[BackendFactory, str]] = {
    "dummy": "parallelenv.backends.dummy:DummyBackend",
    "subproc": "parallelenv.backends.subproc.backend:SubprocBackend",
    "ray": "parallelenv.backends.ray.para_modes:make_ray",
    "ray-subproc": "parallelenv.backends.ray.para_modes:make_ray_subproc",
    "tensor": "parallelenv.backends.tensor:TensorBackend",
}

# Backends that run their own kind of env, not a list of Gymnasium envs:
# how ``ParallelEnv.make(env_id, num_envs, para_mode)`` builds it.
_ENV_MAKERS: dict[str, Union[Callable[..., Any], str]] = {
    "tensor": "parallelenv.envs:make_tensor_env",
}


def register_backend(name: str, factory: BackendFactory, make_envs: Callable[..., Any] | None = None) -> None:
    """Make ``para_mode=name`` build its backend with ``factory``.

    Args:
        name: the ``para_mode`` string.
        factory: called as ``factory(envs, config, **backend_options)`` with
            the ``envs`` the user gave, and returning an object that follows
            :class:`~parallelenv.backends.Backend`.
        make_envs: for a backend that runs its own kind of env (as
            ``"tensor"`` runs one batched TensorEnv), how
            :meth:`~parallelenv.ParallelEnv.make` builds it:
            ``make_envs(env_id, num_envs, **kwargs)``. Default: a list of
            ``gymnasium.make(env_id, **kwargs)`` factories.

    Example:
        >>> from parallelenv import register_backend
        >>> from parallelenv.backends.dummy import DummyBackend
        >>> register_backend("my-dummy", DummyBackend)
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"a backend name must be a non-empty str, not {name!r}")
    if not callable(factory):
        raise TypeError(f"the factory of backend {name!r} is not callable")
    _REGISTRY[name] = factory
    if make_envs is None:
        _ENV_MAKERS.pop(name, None)
    else:
        _ENV_MAKERS[name] = make_envs


def backend_names() -> list[str]:
    return list(_REGISTRY)


def env_maker(name: str) -> Callable[..., Any] | None:
    """How ``ParallelEnv.make`` builds the envs of backend ``name``; None: Gymnasium env factories."""
    resolve_backend(name)  # an unknown name is refused as para_mode= is
    maker = _ENV_MAKERS.get(name)
    if isinstance(maker, str):
        maker = _ENV_MAKERS[name] = _load(maker)
    return maker


def resolve_backend(name: str) -> BackendFactory:
    """The factory registered for ``name``; a ValueError lists the valid names."""
    try:
        factory = _REGISTRY[name]
    except (KeyError, TypeError):
        valid = ", ".join(repr(n) for n in _REGISTRY)
        raise ValueError(f"para_mode={name!r} is not a backend; use one of {valid}") from None
    if isinstance(factory, str):
        factory = _REGISTRY[name] = _load(factory)
    return factory


def _load(path: str) -> Any:
    """The object at ``module:attribute``, imported on first use."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)
