"""Garbage collection paused from a slot's reports until its directives are out,
and never left paused: per epoch number, ended by the epoch, by a stalled loop's
time limit and by stop."""

from __future__ import annotations

import gc
import time

import pytest

from controller.core import CollectionPause, Controller
from tests.controller_server_support import config, hello, report, sample, wait_until


@pytest.fixture(autouse=True)
def collection_back_on():
    yield
    gc.enable()


def test_off_until_a_loop_turns_it_on():
    pause = CollectionPause(longest=10)
    pause.pause(1)
    assert gc.isenabled()


def test_one_pause_per_epoch_number():
    pause = CollectionPause(longest=10)
    pause.enabled = True
    pause.pause(1)
    assert not gc.isenabled()
    pause.resume()
    assert gc.isenabled()
    # A straggler of the same epoch number after the epoch: no second pause.
    pause.pause(1)
    assert gc.isenabled()
    pause.pause(2)
    assert not gc.isenabled()
    pause.resume()
    assert gc.isenabled()


def test_a_pause_that_outlives_its_limit_ends_at_the_next_report():
    pause = CollectionPause(longest=0.05)
    pause.enabled = True
    pause.pause(1)
    assert not gc.isenabled()
    time.sleep(0.1)
    pause.pause(1)
    assert gc.isenabled()


def test_collection_left_alone_when_it_was_off_already():
    gc.disable()
    pause = CollectionPause(longest=10)
    pause.enabled = True
    pause.pause(1)
    pause.resume()
    assert not gc.isenabled()  # not ours to turn on


def test_a_running_controller_pauses_between_report_and_directives(tmp_path):
    # Reports trigger the epoch, but no sooner than half a slot (2 s) after the
    # loop began: the report below is taken well before its epoch runs.
    c = Controller(config(tmp_path, slot_seconds=4.0, epoch_trigger="reports"))
    try:
        c.start(serve_metrics=False)
        c.on_hello(hello("n1").hello)
        assert gc.isenabled()
        c.on_report(report("n1", 1, [sample()]).report)
        assert c.epoch == 0 and not gc.isenabled()
        wait_until(lambda: c.epoch == 1, "the epoch")
        wait_until(gc.isenabled, "collection back on after the epoch")
    finally:
        c.stop()
    assert gc.isenabled()


def test_stop_ends_a_pause(tmp_path):
    c = Controller(config(tmp_path, slot_seconds=60.0, epoch_trigger="reports"))
    c.start(serve_metrics=False)
    c.on_hello(hello("n1").hello)
    c.on_report(report("n1", 1, [sample()]).report)
    assert not gc.isenabled()
    c.stop()
    assert gc.isenabled()
