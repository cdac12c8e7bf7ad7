"""What the forkserver imports before it forks any worker (the start context preloads this module alone).

The workers' code, imported once here, so that each worker forked from the
server has it already; and the server's last act, once its caller and every
worker have gone: removing its folder if the caller could not (see
:mod:`~parallelenv.backends.subproc.forkserver_folder`). Nothing else imports
this module: a worker forked from the server ends by ``os._exit``, so the
``atexit`` it inherits never runs there.
"""

import atexit

from parallelenv.backends.subproc import worker  # noqa: F401  (imported for the workers)
from parallelenv.backends.subproc.forkserver_folder import remove_own_folder_if_orphaned

atexit.register(remove_own_folder_if_orphaned)
