"""Batched envs written as torch tensor code, and the ``tensor`` backend that runs them.

Importing this package imports torch; ``import parallelenv`` alone does not.
"""

from __future__ import annotations

from parallelenv.arrays import import_torch

import_torch("the tensor backend")

from parallelenv.tensor.env import TensorEnv, default_device, fill_rows, put_rows
from parallelenv.tensor.random import CounterRNG

__all__ = ["CounterRNG", "TensorEnv", "default_device", "fill_rows", "put_rows"]
