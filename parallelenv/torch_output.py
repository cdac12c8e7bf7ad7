"""``output="torch"``: any backend's results handed over as torch tensors on a device.

Imported only when asked for, since it imports torch.
"""

from __future__ import annotations

from typing import Any

from parallelenv.arrays import import_torch, to_torch, tree_map

torch = import_torch("output='torch'")


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
        return to_torch(value, self.device)

    def results(self, results: Any, align: str) -> Any:
        """Obs, reward, terminated and truncated as tensors; infos stay as they are."""
        if align == "batch":
            return [(self.tensors(obs), *rest) for obs, *rest in results]
        *arrays, info = results
        return (*(self.tensors(a) for a in arrays), info)

    def actions(self, actions: Any) -> Any:
        """Torch actions (also inside dicts and tuples) as NumPy; anything else as it is."""
        return tree_map(lambda x: x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x, actions)
