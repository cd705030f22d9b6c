"""StopOnSignals wakes the main thread whichever thread a stop signal lands on,
and its handler takes no lock (each case in a subprocess of its own, so a hang
fails the test on a timeout instead of hanging the suite)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

WAKES_WITHIN_SECONDS = 30


def _run(body: str) -> subprocess.CompletedProcess:
    script = "import os, signal, threading, time\n"
    script += "from dsched.signals import StopOnSignals\n" + textwrap.dedent(body)
    try:
        return subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=WAKES_WITHIN_SECONDS,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still waiting {WAKES_WITHIN_SECONDS} s after the signal")


def test_a_signal_delivered_to_another_thread_ends_block():
    # The kernel may hand a process's SIGTERM to any thread that does not block
    # it; here it goes to a worker thread while the main thread sleeps in block().
    done = _run(
        """
        stop = StopOnSignals().install()

        def kill_from_here():
            time.sleep(0.3)
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

        threading.Thread(target=kill_from_here).start()
        stop.block()
        print(signal.Signals(stop.signum).name, stop.event.is_set())
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["SIGTERM", "True"]


def test_a_signal_while_the_main_thread_holds_the_events_lock_sets_it_later():
    # The handler runs between two bytecodes of the main thread, which may be
    # inside Event.wait holding the event's own lock: setting it there would wait
    # on itself forever.
    done = _run(
        """
        before = signal.getsignal(signal.SIGINT)
        stop = StopOnSignals().install()
        with stop.event._cond:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            print(stop.is_set())
        print(stop.event.wait(10))
        stop.restore()
        # What was in force before, whatever that was (SIG_IGN under nohup).
        print(signal.getsignal(signal.SIGINT) is before)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True"]
