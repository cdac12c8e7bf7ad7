"""The ``ray`` and ``ray-subproc`` backends: groups of envs in Ray actors.

:mod:`~.backend` is the caller's side, :mod:`~.para_modes` its two factories; :mod:`~.actor_host` what runs in each
actor (a dummy or subproc backend over the actor's envs); :mod:`~.cluster`
starts, shares and stops the local Ray cluster; :mod:`~.resources` compares
what the actors ask with what the cluster has, before they are created.
"""
