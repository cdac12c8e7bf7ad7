"""The ``subproc`` backend: envs in worker processes, results in shared memory.

:mod:`~.backend` is the parent's side, :mod:`~.workers` its handle on each
worker process; :mod:`~.worker` the workers' side; :mod:`~.wire` the messages
between them, :mod:`~.sendable` a reply made sendable; :mod:`~.shm` the shared
buffers; :mod:`~.countdown` the one wake-up of every worker and of the parent
for a step of every env, :mod:`~.counted` the parent's side of such a step and
:mod:`~.futex` the wake-up of all workers in one call; :mod:`~.lifeline` and
:mod:`~.spawning` how workers start and never outlive their parent,
:mod:`~.forkserver_preload` what the forkserver does beside forking them, and
:mod:`~.forkserver_folder` how its folder in the temp folder goes with the job.
"""
