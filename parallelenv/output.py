"""What ``output=`` and ``device=`` ask of a ParallelEnv's results, checked before and after its backend starts."""

from __future__ import annotations

from typing import Any

from parallelenv.arrays import import_torch
from parallelenv.backends.base import Backend
from parallelenv.devices import torch_device


def check_output(output: Any, device: Any) -> None:
    """Before any worker starts: a bad value, or torch missing where it is asked for, says so."""
    if output not in (None, "numpy", "torch"):
        raise ValueError(f"output={output!r}; use 'numpy' or 'torch'")
    if output == "numpy" and device is not None:
        raise ValueError("device= is for output='torch'")
    if device is not None:
        torch_device(device)  # a CUDA device that this torch or machine cannot give says so in our words
    elif output == "torch":
        import_torch("output='torch'")  # or says what to install


def converter(output: Any, device: Any, native_output: str, backend: Backend, para_mode: str) -> Any:
    """The :class:`~parallelenv.torch_output.TorchOutput` that turns ``backend``'s results into what
    ``output`` asks for, or None where they are that already; ValueError where they cannot be."""
    if native_output != "torch" and (output == "torch" or device is not None):
        buffers = backend.buffers
        if buffers.private_obs or buffers.private_actions:
            raise ValueError(
                f"output='torch': a space of no fixed shape ({backend.single_observation_space} or "
                f"{backend.single_action_space}) has no tensor form; use NumPy output"
            )
        from parallelenv.torch_output import TorchOutput  # imports torch: only when asked for

        return TorchOutput(device)
    if native_output == "torch" and output == "numpy":
        raise ValueError(f"output='numpy': the results of para_mode={para_mode!r} are torch tensors")
    return None
