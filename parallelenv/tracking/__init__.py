"""Where each env's calls stand, from the front object's call to the results it hands back.

:mod:`~.inflight` dispatches, waits, absorbs replies and hands results over
(:class:`~.inflight.InFlight`), one path for every step whatever its replies;
:mod:`~.ledger` records each env's state (a step of every env as one entry); :mod:`~.resuming` turns rebuilt envs'
replies into results; :mod:`~.results` shapes what is handed over.
"""
