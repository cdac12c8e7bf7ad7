"""Where each env's calls stand, from the front object's call to the results it hands back.

:mod:`~.inflight` dispatches, waits and absorbs replies (:class:`~.inflight.InFlight`);
:mod:`~.whole_step` is its shortcut for a step of every env answered in one reply;
:mod:`~.ledger` records each env's state; :mod:`~.resuming` turns rebuilt envs'
replies into results; :mod:`~.results` shapes what is handed over.
"""
