"""Stopping on SIGTERM exactly as on SIGINT, for every dsched entry point.

``systemctl stop``, CI runners and ``timeout`` send SIGTERM; a terminal sends
SIGINT. Both mean "stop": every entry point stops what it started (child
processes, cgroups it made and no longer needs, sockets) and exits with a
status that says how it ended. One rule, documented in docs/operations.md
("Stopping"):

- the daemons (``dsched-agent``, ``dsched-controller``, ``dsched-history run``)
  run until they are told to stop, so a stop by SIGTERM or SIGINT is their
  normal end: exit status :data:`STOPPED` (0);
- runs that have an end of their own (``dsched demo``, ``dsched bench ...``)
  stopped early by SIGTERM or SIGINT clean up, then exit with
  :data:`INTERRUPTED` (130), whichever of the two signals came;
- 2 is a bad argument or configuration (nothing started), 1 a failure.

Two tools:

- :class:`StopOnSignals`: while active, both signals set an event instead of
  interrupting whatever runs (a daemon's main loop, a run that finishes its
  epoch and writes its summary). Startup waits that may take long call
  :func:`check_stop`, which raises :class:`Interrupted` once a stop was asked
  for, so a stop during startup does not wait for the startup to finish.
- :func:`sigterm_as_interrupt`: SIGTERM raises :class:`KeyboardInterrupt` as
  SIGINT does by default, so code written for Ctrl-C (``try``/``finally``)
  cleans up on SIGTERM too. ``dsched`` runs every demo and benchmark under it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

STOPPED = 0
INTERRUPTED = 130
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def signal_name(signum: int | None) -> str:
    """``SIGTERM`` for 15; "a stop signal" when unknown."""
    try:
        return signal.Signals(signum).name if signum else "a stop signal"
    except ValueError:
        return f"signal {signum}"


class Interrupted(KeyboardInterrupt):
    """A stop was asked for (SIGINT or SIGTERM): what runs gives up, and the
    ``finally`` blocks on the way out stop what was started.

    A :class:`KeyboardInterrupt`, so that ``except Exception`` never swallows it
    and code written for Ctrl-C handles it the same way.
    """

    def __init__(self, signum: int | None = None):
        super().__init__(f"{signal_name(signum)} received")
        self.signum = signum


# The StopOnSignals in force, innermost last (only the main thread installs them).
_active: list[StopOnSignals] = []


#: How often a thread that sleeps until a stop (:meth:`StopOnSignals.block`)
#: returns to the interpreter, which runs a signal's handler only then.
WAKE_SECONDS = 0.5


class StopOnSignals:
    """Context manager: SIGINT and SIGTERM set :attr:`event` and record :attr:`signum`.

    The handlers in force before are put back on exit. ``event`` may be given
    (a run that passes its own event to its workers).

    The handler takes no lock: it runs in the main thread between two bytecodes,
    possibly inside ``Event.wait`` while that thread holds the event's lock, so
    it only writes a byte to a pipe, and a thread of its own sets the event.
    """

    def __init__(self, event: threading.Event | None = None):
        self.event = event if event is not None else threading.Event()
        self.signum: int | None = None
        self._old: dict[int, Any] = {}
        self._wake_fd: int | None = None

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
        if self._wake_fd is not None:
            try:
                os.write(self._wake_fd, b"\0")
            except OSError:
                pass  # full (already woken) or closed by restore()

    def _set_on_wake(self, read_fd: int) -> None:
        try:
            if os.read(read_fd, 1):
                self.event.set()
        finally:
            os.close(read_fd)

    def install(self) -> StopOnSignals:
        read_fd, self._wake_fd = os.pipe()
        os.set_blocking(self._wake_fd, False)
        threading.Thread(
            target=self._set_on_wake, args=(read_fd,), name="dsched-stop", daemon=True
        ).start()
        for sig in STOP_SIGNALS:
            self._old[sig] = signal.signal(sig, self._handle)
        _active.append(self)
        return self

    def restore(self) -> None:
        """Put back the handlers in force before :meth:`install` (idempotent)."""
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()
        if self._wake_fd is not None:
            # The setter thread reads the end of the pipe and exits.
            os.close(self._wake_fd)
            self._wake_fd = None
        if self in _active:
            _active.remove(self)

    def __enter__(self) -> StopOnSignals:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def is_set(self) -> bool:
        # signum first: the event is set a moment after the handler ran.
        return self.signum is not None or self.event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to ``timeout`` seconds; True as soon as a stop is asked for."""
        return self.event.wait(timeout)

    def block(self) -> None:
        """Sleep until a stop is asked for.

        In short waits, not one: a process-directed signal may be delivered to
        any thread (one of gRPC's, say), and the interpreter runs its handler
        only when the main thread next runs bytecode, which a wait without a
        timeout never lets it do."""
        while not self.event.wait(WAKE_SECONDS):
            pass

    def check(self) -> None:
        """Raise :class:`Interrupted` if a stop was asked for."""
        if self.is_set():
            raise Interrupted(self.signum)


def stop_requested() -> bool:
    """Whether a stop signal arrived under any :class:`StopOnSignals` in force."""
    return any(s.is_set() for s in _active)


def check_stop() -> None:
    """Raise :class:`Interrupted` if a stop signal arrived under a :class:`StopOnSignals`
    in force (a no-op when none is: library use, tests)."""
    for s in _active:
        s.check()


def raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signum)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While active, SIGTERM raises :class:`Interrupted` (a KeyboardInterrupt), as
    SIGINT does under Python's default handler; both are put back on exit."""
    old_term = signal.signal(signal.SIGTERM, raise_interrupt)
    old_int = signal.getsignal(signal.SIGINT)
    if old_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old_term)
        if old_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, old_int)


@contextmanager
def held() -> Iterator[None]:
    """SIGINT and SIGTERM ignored while everything is stopped in order (a second
    Ctrl-C must not cut a cleanup short); the handlers in force are put back."""
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
