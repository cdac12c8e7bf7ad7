"""What ``output=`` and ``device=`` ask of a ParallelEnv's results: checked before and after its backend
starts, and, for ``output="torch"``, any backend's results handed over as torch tensors on a device.

torch is imported only when a torch device or output is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from parallelenv.arrays import import_torch, to_torch, torch_device, tree_map

if TYPE_CHECKING:
    from parallelenv.backends.base import Backend


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
    """The :class:`TorchOutput` that turns ``backend``'s results into what
    ``output`` asks for, or None where they are that already; ValueError where they cannot be."""
    if native_output != "torch" and (output == "torch" or device is not None):
        buffers = backend.buffers
        if buffers.private_obs or buffers.private_actions:
            raise ValueError(
                f"output='torch': a space of no fixed shape ({backend.single_observation_space} or "
                f"{backend.single_action_space}) has no tensor form; use NumPy output"
            )
        return TorchOutput(device)
    if native_output == "torch" and output == "numpy":
        raise ValueError(f"output='numpy': the results of para_mode={para_mode!r} are torch tensors")
    return None


class TorchOutput:
    """Converts results to tensors on ``device`` and torch actions back to NumPy.

    Example:
        >>> import gymnasium as gym
        >>> from parallelenv import ParallelEnv
        >>> with ParallelEnv([lambda: gym.make("CartPole-v1")] * 2, para_mode="dummy", output="torch") as penv:
        ...     obs, info = penv.reset(seed=0)
        >>> type(obs).__name__, obs.device.type
        ('Tensor', 'cpu')
    """

    def __init__(self, device: Any) -> None:
        self._torch = torch = import_torch("output='torch'")  # only when asked for: never at import
        self.device = torch.device("cpu" if device is None else device)

    def tensors(self, value: Any) -> Any:
        """Arrays, and dicts and tuples of them, as tensors; the result owns its memory already."""
        return to_torch(value, self.device)

    def results(self, results: Any, align: str) -> Any:
        """Obs, reward, terminated and truncated as tensors; infos stay as they are."""
        if align == "batch":
            return [(self.tensors(obs), *rest) for obs, *rest in results]
        *arrays, info = results
        return (*(self.tensors(a) for a in arrays), info)

    def actions(self, actions: Any) -> Any:
        """Torch actions (also inside dicts and tuples) as NumPy; anything else as it is."""
        tensor = self._torch.Tensor
        return tree_map(lambda x: x.detach().cpu().numpy() if isinstance(x, tensor) else x, actions)
