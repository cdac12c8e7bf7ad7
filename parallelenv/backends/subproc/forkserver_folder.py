"""The forkserver's folders in the temp folder do not pile up, however jobs end.

multiprocessing's forkserver listens on a socket in a ``pymp-*`` folder of
the temp folder, which the caller removes as it exits (an ``atexit``
finaliser). A caller that is SIGKILLed or leaves by ``os._exit`` leaves the
folder behind: a day of tests and killed jobs left thousands in ``/tmp``
here. So the caller marks its folder with its pid and start time before the
forkserver starts (:func:`mark_and_sweep`); the forkserver, which exits once
the caller and every worker have gone, removes the folder if its caller is
gone (:func:`remove_own_folder_if_orphaned`, registered by
:mod:`~parallelenv.backends.subproc.forkserver_preload`); and where the
forkserver was killed too (a whole process group SIGKILLed), the next caller
that starts a forkserver in the same temp folder removes the marked folders
whose caller is gone. Folders without the mark are never touched: they are
not ours; nor are those marked on another machine or in another pid namespace
(a temp folder shared between hosts or containers), whose pids mean nothing here.
"""

from __future__ import annotations

import os
import select
import shutil
import socket
from multiprocessing import util
from pathlib import Path

MARK = "parallelenv-caller"
# How long a forkserver waits, as it ends, for its caller to end (a killed caller's files close first).
CALLER_END_S = 5.0
_swept = False


def mark_and_sweep() -> None:
    """In a caller about to start processes from a forkserver: mark its folder, and, once per process,
    remove the marked folders of callers that are gone."""
    global _swept
    folder = Path(util.get_temp_dir())  # created here if need be; the forkserver's socket will be in it
    mark = folder / MARK
    if not mark.exists():
        written = folder / f".{MARK}.{os.getpid()}"
        try:
            written.write_text(f"{_here()} {os.getpid()} {_identity(os.getpid())}")
            os.replace(written, mark)  # a sweeper never reads half a mark
        except OSError:  # a full disk, say: the folder is left as multiprocessing leaves it, no worse
            written.unlink(missing_ok=True)
    if not _swept:
        _swept = True
        sweep(folder.parent)


def sweep(temp_folder: str | os.PathLike[str]) -> None:
    """Remove the marked ``pymp-*`` folders in ``temp_folder`` whose caller is gone."""
    for folder in Path(temp_folder).glob("pymp-*"):
        remove_if_orphaned(folder)


def remove_if_orphaned(folder: str | os.PathLike[str]) -> None:
    """Remove ``folder`` if it bears our mark and the process that marked it is gone."""
    marked = _marked_by(folder)
    if marked is not None and _identity(marked[0]) != marked[1]:
        shutil.rmtree(folder, ignore_errors=True)


def _marked_by(folder: str | os.PathLike[str]) -> tuple[int, str] | None:
    """The pid and identity of the process that marked ``folder`` on this host; None where none did."""
    try:
        where, pid, identity = (Path(folder) / MARK).read_text().split(" ", 2)
        return (int(pid), identity) if where == _here() else None
    except (OSError, ValueError):  # not ours, not a folder, or gone already
        return None


def _here() -> str:
    """The machine and pid namespace whose pids a mark names."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"{socket.gethostname()}/{namespace}"


def _identity(pid: int) -> str | None:
    """What tells the process ``pid`` apart from a later one given the same pid (its start time, where
    ``/proc`` says it), or None if there is no process ``pid``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # The command's name, in parentheses, may hold spaces: the state is the first field after it,
            # the start time the 20th.
            fields = stat.read().rpartition(b")")[2].split()
        # A zombie has ended: its parent has yet to reap it (the forkserver's caller may be one as it exits).
        return None if fields[0] in (b"Z", b"X") else fields[19].decode()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None
    except (OSError, IndexError):
        pass
    try:  # no /proc (macOS): whether the pid is in use at all
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return "-"


def _socket_folder() -> str | None:
    """The folder of this process's forkserver's socket, if one was started (or this is the forkserver)."""
    from multiprocessing import forkserver  # here, not above: the module is of no use where forkserver is not

    address = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_address", None)
    return os.path.dirname(address) if isinstance(address, str) and address.startswith("/") else None


def remove_own_folder_if_orphaned() -> None:
    """The forkserver's ``atexit``: its caller has closed its end, and every worker has gone."""
    folder = _socket_folder()
    if folder is not None and os.path.basename(folder).startswith("pymp-"):
        _await_caller_end(folder)
        remove_if_orphaned(folder)


def _await_caller_end(folder: str) -> None:
    """Wait, :data:`CALLER_END_S` at most, for the caller that marked ``folder`` to end. The forkserver
    ends when its caller's files close, and a killed caller closes them before it has ended: its mark
    would still name a live process, and the folder be left behind."""
    marked = _marked_by(folder)
    if marked is None or not hasattr(os, "pidfd_open"):
        return
    try:
        process = os.pidfd_open(marked[0])  # readable once the process has ended
    except OSError:  # gone already
        return
    try:
        select.select([process], [], [], CALLER_END_S)
    finally:
        os.close(process)

