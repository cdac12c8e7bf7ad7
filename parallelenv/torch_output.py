"""``output="torch"``: any backend's results handed over as torch tensors on a device.

Imported only when asked for, since it imports torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

try:
    import torch
except ImportError:
    raise ImportError("output='torch' needs PyTorch: pip install 'parallelenv[torch]'") from None


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
        self.device = torch.device("cpu" if device is None else device)

    def tensors(self, value: Any) -> Any:
        """Arrays, and dicts and tuples of them, as tensors; the result owns its memory already."""
        if isinstance(value, np.ndarray):
            return torch.from_numpy(value).to(self.device)
        if isinstance(value, dict):
            return {key: self.tensors(sub) for key, sub in value.items()}
        if isinstance(value, tuple):
            return tuple(self.tensors(sub) for sub in value)
        return value

    def results(self, results: Any, align: str) -> Any:
        """Obs, reward, terminated and truncated as tensors; infos stay as they are."""
        if align == "batch":
            return [(self.tensors(obs), *rest) for obs, *rest in results]
        *arrays, info = results
        return (*(self.tensors(a) for a in arrays), info)

    def actions(self, actions: Any) -> Any:
        if isinstance(actions, torch.Tensor):
            return actions.detach().cpu().numpy()
        if isinstance(actions, dict):
            return {key: self.actions(sub) for key, sub in actions.items()}
        if isinstance(actions, tuple):
            return tuple(self.actions(sub) for sub in actions)
        return actions
