"""The ``subproc`` backend: envs in worker processes, results in shared memory.

:mod:`~.backend` is the parent's side; :mod:`~.worker` the workers';
:mod:`~.wire` the messages between them; :mod:`~.shm` the shared buffers;
:mod:`~.countdown` the one wake-up of a step of every env; :mod:`~.lifeline`
and :mod:`~.spawning` how workers start and never outlive their parent.
"""
