"""Torch devices asked for by the user, checked in our words before any tensor is made there."""

from __future__ import annotations

from typing import Any

from parallelenv.arrays import import_torch


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
