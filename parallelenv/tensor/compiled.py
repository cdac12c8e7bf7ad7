"""A TensorEnv's whole batch step, restarts of the ended rows included, as one compiled function.

Eager torch runs a step as some fifty operations, each a pass over the whole
batch (on the CPU) or a kernel launch (on a GPU). Compiled, the env's step,
its random draws, the copy of the last obs of the envs that ended and their
restart become a few fused loops: torch.compile (inductor) on every device,
and on CUDA the compiled step is captured once in a CUDA graph and replayed,
one launch a step. The eager step is the reference: what is compiled is the
same Python code (the shipped envs take a branch of pure operations when
compiled, the same operations in the same order), and an env whose step
cannot be compiled runs eager, said once in a :class:`CompileFallbackWarning`.
The tensor backend's default, ``compile="auto"``, compiles the shipped envs
on the CPU from :data:`AUTO_MIN_ENVS` envs.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import torch

from parallelenv.errors import ParallelEnvWarning
from parallelenv.tensor.env import TensorEnv

_log = logging.getLogger("parallelenv.tensor")

#: The ``compile`` values the tensor backend takes, and what each does.
MODES = {
    False: "eager torch, an operation at a time",
    True: "the best for the env's device: 'inductor' on the CPU, 'inductor+graph' on CUDA",
    "inductor": "torch.compile's inductor: the step's operations fused into a few loops or kernels",
    "inductor+graph": "inductor's kernels captured once in a CUDA graph and replayed (CUDA only)",
    "graph": "the eager step's kernels captured once in a CUDA graph and replayed (CUDA only)",
    "auto": "the default: 'inductor' for an env whose class sets compiles_by_default (the shipped ones) with "
            "at least AUTO_MIN_ENVS envs on the CPU, else eager",
}

#: The fewest envs "auto" compiles: below, on the CPU, a step is too short for its compile time (seconds)
#: to pay back in a typical run, and the measured gain is smaller.
AUTO_MIN_ENVS = 65_536


class CompileFallbackWarning(ParallelEnvWarning):
    """A TensorEnv's step could not be compiled, or captured: it runs eager, as correct and slower."""


def resolve_mode(compile: Any, env: TensorEnv) -> str | None:
    """The mode ``compile`` asks for ``env`` (None: eager), or a ValueError listing the valid ones."""
    if compile is False or compile is None:
        return None
    device = env.device
    cuda = device.type == "cuda"
    if compile == "auto":
        # On CUDA at every size: the captured graph launches a step's kernels at once, where eager pays a
        # launch per operation whatever the batch (the tensor page's table); on the CPU from AUTO_MIN_ENVS.
        compiles = type(env).compiles_by_default and (cuda or env.num_envs >= AUTO_MIN_ENVS)
        if not compiles or not _has_inductor():
            return None
        return "inductor+graph" if cuda else "inductor"
    if compile is True:
        return "inductor+graph" if cuda else "inductor"
    if not isinstance(compile, str) or compile not in MODES:
        valid = ", ".join(repr(mode) for mode in MODES)
        raise ValueError(f"compile={compile!r}; valid: {valid}")
    if compile.endswith("graph") and not cuda:
        raise ValueError(f"compile={compile!r} captures a CUDA graph, but the env is on {device}: use compile=True "
                         "or 'inductor'")
    return compile


def _has_inductor() -> bool:
    try:
        import torch._inductor  # noqa: F401
    except ImportError:
        return False
    return True


class FusedStep:
    """Steps every env of ``env`` (those of ``live`` where given) and, with ``restarts``, restarts the ones
    that ended, writing their last obs into ``ended`` and the ended mask into ``done``.

    Args:
        env: the TensorEnv.
        restarts: whether ended envs start again in the same step (``asynchronous="restart"``).
        ended: ``env.obs``'s twin receiving the obs of every env before the restart (rows of the envs
            that did not end hold their obs too; the ``_ended_state`` mask says which rows count).
        done: a bool tensor over the envs receiving which ended (and were stepped).
        mode: a value of :data:`MODES` as :func:`resolve_mode` gives it.
    """

    def __init__(self, env: TensorEnv, restarts: bool, ended: torch.Tensor, done: torch.Tensor, mode: str,
                 asked: bool = True) -> None:
        self.env, self.restarts, self.ended, self.done, self.mode = env, restarts, ended, done, mode
        # A compile the caller did not ask for is said where it is seen (a warning-level log), once.
        self._level = logging.INFO if asked else logging.WARNING
        self._compiled: Any = None
        if "inductor" in mode:
            # fullgraph: a step that breaks the graph would run part eager, part compiled, the worst of both;
            # it raises instead, and runs eager whole. dynamic=False: a batch's size never changes.
            self._fused = torch.compile(self._traced, fullgraph=True, dynamic=False)
            # The flags travel as uint8 views: see _traced.
            self._flags = tuple(flag.view(torch.uint8) for flag in (env.terminated, env.truncated, done))
            self._compiled = self._run_compiled
        self._graphs: dict[bool, _Graph] = {}  # by whether a live mask is given
        self._timed: set[bool] = set()
        self._fallen_back = False

    def __call__(self, actions: torch.Tensor, live: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """One batch step; returns the infos of the env's step (copies), ``env.infos`` left empty."""
        if self._fallen_back:
            return self._run(actions, live)
        started = time.perf_counter() if (live is not None) not in self._timed else None
        try:
            if started is None:
                infos = self._step(actions, live)
            else:
                with warnings.catch_warnings():
                    # torch's compiler warns of its own deprecations, which a caller's "error" filter would
                    # turn into a failed compile.
                    warnings.simplefilter("ignore", DeprecationWarning)
                    infos = self._step(actions, live)
        except _CaptureFailed as failed:  # the step ran before its capture failed: its results stand
            self._fall_back(failed.cause)
            return failed.infos
        except Exception as exc:
            if not _cannot_compile(exc):
                raise
            self._fall_back(exc)
            return self._run(actions, live)
        if started is not None:
            self._timed.add(live is not None)
            what = "its live-mask form" if live is not None else "the whole-batch step"
            _log.log(self._level, "parallelenv: compiled %s of %s (%d envs, %s) in %.1f s, once%s", what,
                     type(self.env).__name__, self.env.num_envs, self.mode, time.perf_counter() - started,
                     "" if self._level == logging.INFO else " (compile='auto'; compile=False runs eager)")
        return infos

    def invalidate(self) -> None:
        """Forget the captured CUDA graphs: a call that may change the env's attributes was made."""
        self._graphs.clear()

    def _step(self, actions: torch.Tensor, live: torch.Tensor | None) -> dict[str, torch.Tensor]:
        run = self._compiled if self._compiled is not None else self._run
        if not self.mode.endswith("graph"):
            return run(actions, live)
        graph = self._graphs.get(live is not None)
        if graph is None or not graph.takes(actions, live):
            graph = self._graphs[live is not None] = _Graph(run)
        return graph(actions, live)

    def _run(self, actions: torch.Tensor, live: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """The step as eager code; the same as the tensor backend's eager road (TensorBackend._step and
        _finish) for a step of every env."""
        infos, done = self._step_and_restart(actions, live)
        if done is not None:
            self.done.copy_(done)
        return infos

    def _run_compiled(self, actions: torch.Tensor, live: torch.Tensor | None) -> dict[str, torch.Tensor]:
        if actions.dim() == 2 and actions.shape[1] > 1 and actions.device.type == "cpu":
            # Column by column, the same values: a compiled CPU loop reading a column of a row-major
            # tensor runs a row at a time, and so does all it fuses with it (the tensor page's Chasing rows).
            actions = actions.t().contiguous().t()
        return self._fused(actions, None if live is None else live.view(torch.uint8), *self._flags)

    def _traced(self, actions: torch.Tensor, live: torch.Tensor | None, terminated: torch.Tensor,
                truncated: torch.Tensor, done: torch.Tensor) -> dict[str, torch.Tensor]:
        """:meth:`_run` as it is compiled, the bool tensors (``live``, the env's flags, ``done``) given as
        uint8 views of themselves: inductor's CPU loops load and store bools an element at a time (a bool
        store can cost more than the rest of a CartPole step), and uint8 through int32 at full width.
        The env steps with flags of the graph's own, written once at the end."""
        env = self.env
        outputs = env.terminated, env.truncated
        env.terminated, env.truncated = _as_bool(terminated), _as_bool(truncated)
        infos, ended = self._step_and_restart(actions, None if live is None else _as_bool(live))
        terminated.copy_(_as_uint8(env.terminated))
        truncated.copy_(_as_uint8(env.truncated))
        if ended is not None:
            done.copy_(_as_uint8(ended))
        env.terminated, env.truncated = outputs
        env._stepped = None
        return infos

    def _step_and_restart(
        self, actions: torch.Tensor, live: torch.Tensor | None,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """The step's infos (copies) and, with restarts, the mask of the envs that ended and restarted."""
        env = self.env
        if live is None:
            env.infos = {}
            env.step_envs(actions)
        else:
            env.step_where(actions, live)
        infos = {key: value.clone() for key, value in env.infos.items()}
        if not self.restarts:
            return infos, None
        done = torch.logical_or(env.terminated, env.truncated)
        if live is not None:
            done &= live
        self.ended.copy_(env.obs)
        # A mask, not an index: an index's length is data the host would have to wait for.
        env.reset_rows(done)
        env.infos = {}
        return infos, done

    def _fall_back(self, exc: Exception) -> None:
        self._fallen_back = True
        self._graphs.clear()
        first_line = " ".join(str(exc).split())[:300]
        warnings.warn(
            f"{type(self.env).__name__}'s step could not be compiled (compile={self.mode!r}): it runs eager. "
            f"{type(exc).__name__}: {first_line}", CompileFallbackWarning, stacklevel=4)


class _Graph:
    """One step captured in a CUDA graph: its inputs copied into fixed tensors, then replayed.

    The first call runs the step (compiling it, for inductor) on a side stream, as capture asks, and
    captures it after: capture records kernels without running them, so the first replay is that
    call's own step. Later calls replay it.
    """

    def __init__(self, run: Any) -> None:
        self.run = run
        self.graph: Any = None
        self.actions: torch.Tensor | None = None
        self.live: torch.Tensor | None = None
        self.infos: dict[str, torch.Tensor] = {}

    def takes(self, actions: torch.Tensor, live: torch.Tensor | None) -> bool:
        """Whether the captured step fits these inputs (a new shape or dtype needs a new capture)."""
        if self.actions is None:
            return True
        return _same_kind(actions, self.actions) and (live is None or _same_kind(live, self.live))

    def __call__(self, actions: torch.Tensor, live: torch.Tensor | None) -> dict[str, torch.Tensor]:
        if self.graph is not None:
            self.actions.copy_(actions)  # type: ignore[union-attr]  # set with the graph
            if live is not None:
                self.live.copy_(live)  # type: ignore[union-attr]  # set with the graph
            self.graph.replay()
            return dict(self.infos)
        self.actions, self.live = actions.clone(), None if live is None else live.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            infos = self.run(self.actions, self.live)  # the step itself
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.infos = self.run(self.actions, self.live)
        except Exception as exc:
            raise _CaptureFailed(exc, infos) from exc
        self.graph = graph
        return infos


class _CaptureFailed(Exception):
    """A step that ran, and whose capture after it failed: it is not to run again (the env stepped once)."""

    def __init__(self, cause: Exception, infos: dict[str, torch.Tensor] | None = None) -> None:
        super().__init__(cause, infos)  # its arguments, so that it pickles whole as every error of ours does
        self.cause, self.infos = cause, infos


def _as_bool(flags: torch.Tensor) -> torch.Tensor:
    return flags.to(torch.int32) != 0


def _as_uint8(mask: torch.Tensor) -> torch.Tensor:
    return mask.to(torch.int32).to(torch.uint8)


def _same_kind(a: torch.Tensor, b: Any) -> bool:
    return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and a.device == b.device


def _cannot_compile(exc: Exception) -> bool:
    """Whether ``exc`` says the step cannot be compiled or captured, rather than that the env raised."""
    from torch._dynamo.exc import TorchDynamoException

    if isinstance(exc, TorchDynamoException):
        return True
    module = type(exc).__module__
    return module.startswith("torch._inductor") or "CUDA graph" in str(exc) or "capture" in str(exc)
