"""The backend registry: ``para_mode`` names resolved to backend factories.

Built-in backends are registered by import path and imported on first use,
so that ``import parallelenv`` never imports ray or torch.
"""

from __future__ import annotations

import importlib
from typing import Union

from parallelenv.backends.base import Backend, BackendConfig, BackendFactory

__all__ = ["Backend", "BackendConfig", "BackendFactory", "register_backend", "resolve_backend", "backend_names"]

_REGISTRY: dict[str, Union[BackendFactory, str]] = {
    "dummy": "parallelenv.backends.dummy:DummyBackend",
    "subproc": "parallelenv.backends.subproc:SubprocBackend",
    "ray": "parallelenv.backends.ray_backend:make_ray",
    "ray-subproc": "parallelenv.backends.ray_backend:make_ray_subproc",
    "tensor": "parallelenv.tensor.front:TensorParallelEnv",
}


def register_backend(name: str, factory: BackendFactory) -> None:
    """Make ``para_mode=name`` build its backend with ``factory``.

    Args:
        name: the ``para_mode`` string.
        factory: called as ``factory(env_sources, config, **backend_options)``
            and returning an object that follows :class:`~parallelenv.backends.Backend`;
            or a :class:`~parallelenv.ParallelEnv` subclass that serves the
            front API itself (as the ``"tensor"`` backend does).

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


def backend_names() -> list[str]:
    return list(_REGISTRY)


def resolve_backend(name: str) -> BackendFactory:
    """The factory registered for ``name``; a ValueError lists the valid names."""
    try:
        factory = _REGISTRY[name]
    except (KeyError, TypeError):
        valid = ", ".join(repr(n) for n in _REGISTRY)
        raise ValueError(f"para_mode={name!r} is not a backend; use one of {valid}") from None
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module), attr)
        _REGISTRY[name] = factory
    return factory
