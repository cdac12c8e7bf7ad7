"""The agent of a VecWorker: its actions checked for the envs, and its updates (garage's agent update)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from parallelenv.arrays import Tree, to_numpy, to_torch
from parallelenv.batching import check_batch


def agent_actions(agent: Any, obs: Tree, ids: np.ndarray, num_envs: int, action_space: gym.Space,
                  env_is_torch: bool, env_device: Any) -> tuple[Tree, Tree]:
    """The agent's actions for the envs ``ids`` from their ``obs``: as it gave them, and as the
    ParallelEnv takes them (tensors on the envs' device, or NumPy checked against ``action_space``,
    an error naming the agent and the envs where they do not fit). No gradients are recorded."""
    torch = sys.modules.get("torch")
    with torch.no_grad() if torch is not None else contextlib.nullcontext():
        action = agent(obs)
    if env_is_torch:
        return action, to_torch(action, env_device)
    try:
        return action, check_batch(action_space, to_numpy(action), len(ids), what="the policy's actions")
    except (TypeError, ValueError) as exc:
        called_on = "" if len(ids) == num_envs else f", called on envs {_named(ids)}"
        raise type(exc)(f"{exc} (policy {agent!r}{called_on})") from None


def updated_agent(agent: Any, policy_or_params: Any) -> Any:
    """The agent after an update (see VecWorker.update_agent): a callable replaces it; a mapping is
    loaded with its ``load_state_dict``; anything else goes to its ``set_param_values``."""
    if callable(policy_or_params):
        return policy_or_params
    if isinstance(policy_or_params, Mapping) and hasattr(agent, "load_state_dict"):
        agent.load_state_dict(policy_or_params)
    elif hasattr(agent, "set_param_values"):
        agent.set_param_values(policy_or_params)
    else:
        raise TypeError(
            f"cannot update a {type(agent).__name__} policy with a {type(policy_or_params).__name__}: "
            "pass a new callable, a state dict for a policy with load_state_dict, or parameters "
            "for a policy with set_param_values"
        )
    return agent


def _named(ids: np.ndarray) -> str:
    """Env ids for an error message: the first few of many."""
    shown = ids[:6].tolist()
    return str(shown) if len(ids) <= 6 else f"{str(shown)[:-1]}, ... ({len(ids)} envs)]"
