"""What a run does when it is told to stop: SIGTERM (sent by ``timeout``, SLURM, Kubernetes,
and by torchrun to each worker) and Ctrl-C (SIGINT) stop it between two writes, so the rows
it holds are written first and a rerun resumes from them.

The handlers are installed for one run only, from the main thread only (Python delivers
signals there), and the ones found are put back on every way out. A SIGTERM whose
disposition was the default ends the process by that same signal once the rows are on disk
(exit status 143 in a shell, ``-15`` from ``subprocess``); a handler of the script's own runs
then, as if the signal had just arrived. SIGTERM ignored by the script stays ignored.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torchlens.errors import ExtractionError

__all__ = ["Terminated", "Guard", "guarded"]


class Terminated(BaseException):
    """SIGTERM arrived: unwinds the run (a BaseException, so ``except Exception`` in model
    code cannot swallow it) through the ``finally`` that writes the rows held."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


class Guard:
    """Turns SIGTERM into :class:`Terminated` and SIGINT into ``KeyboardInterrupt``, except
    while a shard is written (:meth:`writing`): the signal then waits for the write to end."""

    def __init__(self) -> None:
        self._writing = 0
        self._pending: int | None = None
        self._pid = os.getpid()
        self.previous: dict[int, Any] = {}

    def handler(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:  # a forked process (a DataLoader worker): as before
            _restore({signum: self.previous.get(signum, signal.SIG_DFL)})
            signal.raise_signal(signum)
            return
        if self._writing:
            self._pending = signum
            return
        _raise_for(signum)

    @contextmanager
    def writing(self) -> Iterator[None]:
        """A shard write that a signal must not cut in half (its rows would be lost)."""
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1
        if self._pending is not None and not self._writing:
            signum, self._pending = self._pending, None
            _raise_for(signum)


def _raise_for(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


def _ours(signum: int, current: Any) -> bool:
    """Whether to handle ``signum`` during the run, given its current handler: SIGTERM
    unless ignored or set from C; SIGINT only with Python's default (KeyboardInterrupt)."""
    if signum == signal.SIGINT:
        return current is signal.default_int_handler
    return current is signal.SIG_DFL or (callable(current) and current is not signal.SIG_IGN)


@contextmanager
def guarded() -> Iterator[Guard]:
    """Run a block with the run's SIGTERM and SIGINT handlers (main thread only); the
    previous handlers are back whatever way it ends. On SIGTERM, once the block has unwound
    (writing what it held), the signal is raised again under its previous handler."""
    guard = Guard()
    previous = guard.previous
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            current = signal.getsignal(signum)
            if _ours(signum, current):
                previous[signum] = current
                signal.signal(signum, guard.handler)
    try:
        yield guard
    except Terminated as stop:
        _restore(previous)
        previous = {}
        signal.raise_signal(stop.signum)  # the default: the process ends here, by it
        raise ExtractionError(  # the script's own handler returned
            f"signal {stop.signum} stopped the run; the rows it had computed are on disk: "
            "rerun tl.extract with the same arguments to resume",
            code="interrupted",
        ) from None
    finally:
        _restore(previous)


def _restore(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)
