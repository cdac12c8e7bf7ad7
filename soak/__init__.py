"""The soak: every CPU backend for minutes under faults, healing and recycling, its resources kept flat.

``python -m soak [--minutes M] [--backends ...] [--seed S]`` (``make soak``)
runs each backend's ParallelEnv of eight envs with
``asynchronous="restart"``, healing (lossless, ``snapshots=``, where there
are workers) and recycling on, injects faults at seeded random steps (an env
raises in step or in reset, its worker exits, is killed from outside, or
hangs past ``call_timeout``), samples the parent's and the workers'
resources after a warm-up, and prints a table per backend with a PASS or
FAIL per row, one of them that no episode was cut by a lost worker. ``tests/test_soak.py`` runs the same
soak for seconds per backend in ``make test``.

Modules: ``env`` (the faulty, leaky env), ``faults`` (which fault when, and
how), ``profiles`` (each backend's settings), ``resources`` (what is
sampled), ``judge`` (flat or not), ``run`` (one backend's soak), ``report``
(its table), ``cluster`` (the local Ray cluster).
"""
