"""NumPy or torch, nested in dicts and tuples: the conversions the rollout helpers need.

torch is never imported here for NumPy data: a value can only be a tensor
once the caller has imported torch, so ``sys.modules`` answers the question
"is this a tensor?" without an import.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from parallelenv.extras import missing_extra

Tree = Any  # an array or tensor, or a dict / tuple of Trees


def tree_map(fn: Callable[..., Any], *trees: Tree) -> Tree:
    """Apply ``fn`` leaf by leaf to trees of the same structure."""
    first = trees[0]
    if isinstance(first, dict):
        return {key: tree_map(fn, *(tree[key] for tree in trees)) for key in first}
    if isinstance(first, tuple):
        return tuple(tree_map(fn, *parts) for parts in zip(*trees, strict=True))
    return fn(*trees)


def first_leaf(tree: Tree) -> Any:
    while isinstance(tree, (dict, tuple)):
        tree = next(iter(tree.values())) if isinstance(tree, dict) else tree[0]
    return tree


def is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.is_tensor(value)


def import_torch(needed_for: str = "torch output") -> Any:
    """torch, or an ImportError that says what needed it and what to install."""
    try:
        import torch
    except ImportError:
        raise ImportError(missing_extra(f"{needed_for} needs PyTorch", "torch")) from None
    return torch


def to_numpy(tree: Tree) -> Tree:
    """Every tensor leaf as a NumPy array on the host; arrays pass through."""
    if isinstance(tree, np.ndarray):  # the common case, on every step: no tree walk
        return tree
    return tree_map(lambda x: x.detach().cpu().numpy() if is_tensor(x) else np.asarray(x), tree)


def to_torch(tree: Tree, device: Any) -> Tree:
    """Every leaf as a tensor on ``device``; tensors already there are not copied."""
    torch = import_torch()
    return tree_map(lambda x: torch.as_tensor(x, device=device), tree)


def stack(batches: Sequence[Tree]) -> Tree:
    """Stack same-structured batches along a new first axis (NumPy or torch leaves)."""
    return _join(batches, np.stack, "stack")


def concatenate(batches: Sequence[Tree]) -> Tree:
    """Join same-structured batches along their first axis (NumPy or torch leaves)."""
    return _join(batches, np.concatenate, "cat")


def _join(batches: Sequence[Tree], numpy_fn: Callable[..., Any], torch_name: str) -> Tree:
    def join(*leaves: Any) -> Any:
        if is_tensor(leaves[0]):
            return getattr(sys.modules["torch"], torch_name)(leaves)
        return numpy_fn(leaves)

    return tree_map(join, *batches)


def copy_tree(tree: Tree) -> Tree:
    return tree_map(lambda x: x.clone() if is_tensor(x) else np.array(x, copy=True), tree)


def take_rows(tree: Tree, rows: np.ndarray) -> Tree:
    """Rows ``rows`` of every leaf (a copy)."""
    return tree_map(lambda x: x[_index_for(x, rows)], tree)


def put_rows(tree: Tree, rows: np.ndarray, values: Tree) -> None:
    """Write ``values`` into rows ``rows`` of every leaf, in place."""
    def put(x: Any, v: Any) -> None:
        x[_index_for(x, rows)] = v

    tree_map(put, tree, values)


def put_row(tree: Tree, position: int, value: Tree) -> None:
    """Write one env's ``value`` (NumPy or torch) into row ``position`` of every leaf, in place."""
    def put(leaf: Any, v: Any) -> None:
        if is_tensor(leaf) and not is_tensor(v):
            v = sys.modules["torch"].as_tensor(np.asarray(v), device=leaf.device)
        leaf[position] = v

    tree_map(put, tree, value)


def put_masked(tree: Tree, mask: Any, values: Tree) -> bool:
    """Write the rows of ``values`` where ``mask`` is set into ``tree``, in place, all rows at once.

    ``values`` must be batched like ``tree`` (extra dict keys, such as vector-info
    masks, are ignored). Returns False, writing nothing, where it is not: values
    kept as objects (Tuple observations in a vector info) go row by row instead.
    """
    if not _batched_like(values, tree):
        return False

    def put(leaf: Any, v: Any) -> None:
        if is_tensor(leaf):
            torch = sys.modules["torch"]
            rows = torch.as_tensor(mask, device=leaf.device)
            leaf[rows] = torch.as_tensor(v, device=leaf.device)[rows].to(leaf.dtype)
        else:
            leaf[mask] = v[mask]

    tree_map(put, tree, {key: values[key] for key in tree} if isinstance(tree, dict) else values)
    return True


def _batched_like(values: Any, tree: Tree) -> bool:
    if isinstance(tree, dict):
        return isinstance(values, dict) and all(key in values and _batched_like(values[key], tree[key]) for key in tree)
    if isinstance(tree, tuple):
        return isinstance(values, tuple) and len(values) == len(tree) and all(map(_batched_like, values, tree))
    if is_tensor(values):
        return True
    return isinstance(values, np.ndarray) and values.dtype != object and values.shape[1:] == tuple(tree.shape[1:])


def _index_for(leaf: Any, rows: np.ndarray) -> Any:
    if is_tensor(leaf):
        return sys.modules["torch"].as_tensor(rows, device=leaf.device)
    return rows


def torch_device(device: Any, needed_for: str = "device=") -> Any:
    """``device`` as a ``torch.device``, or a ValueError saying why this machine cannot give it.

    Torch itself answers a CUDA device it cannot give with an
    ``AssertionError("Torch not compiled with CUDA enabled")`` from deep in its
    lazy init, at the first tensor made there: this says which argument asked
    for it, whether torch or the machine lacks CUDA, and what to do instead.
    """
    torch = import_torch(needed_for)
    checked = torch.device(device)
    if checked.type != "cuda":
        return checked
    if not torch.backends.cuda.is_built():
        why = (f"this torch ({torch.__version__}) is a CPU-only build. Install a CUDA build of torch "
               "(https://pytorch.org/get-started/locally/)")
    elif not torch.cuda.is_available():
        why = ("torch finds no CUDA GPU on this machine (no GPU or driver, or CUDA_VISIBLE_DEVICES hides them)")
    elif checked.index is not None and checked.index >= torch.cuda.device_count():
        why = f"this machine has {torch.cuda.device_count()} CUDA GPU(s), numbered from 0"
    else:
        return checked
    raise ValueError(f"{needed_for}{str(device)!r} asks for a CUDA GPU, but {why}, or pass device='cpu'")
