"""The driver's watchdog verdict, from heartbeats alone (no Spark, no processes, a fake clock).

The verdict must follow from what the ranks report (inside a collective or not, how far
they got), never from which heartbeat happened to arrive first.
"""
from __future__ import annotations

import itertools

import pytest

from sparkddl.channel.server import Message
from sparkddl.launch.monitor import HEARTBEAT_LOST_S, START_LIMIT_S, StageMonitor

LIMIT = 4.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def beat(rank: int, steps: int, phase: str, collective: str = "", epoch: int | None = 1,
         step: int | None = None) -> Message:
    header = {"type": "heartbeat", "steps": steps, "phase": phase, "collective": collective,
              "epoch": epoch, "step": steps + 1 if step is None else step}
    return Message(rank=rank, header=header)


HUNG_IN_LOSS = beat(1, 19, "computing the loss")
WAITING_IN_BACKWARD = beat(0, 19, "backward pass", "DDP's gradient allreduce (inside backward)")


def stuck(messages: list[Message], world: int = 2, for_s: float = LIMIT + 1,
          gap_s: float = 0.0) -> str:
    """Ranks stop where ``messages`` say (``gap_s`` apart, in that order) and keep sending
    the same heartbeat once a second; the watchdog's verdict ``for_s`` later."""
    clock = Clock()
    monitor = StageMonitor(clock=clock)
    for msg in messages:
        monitor.handle(msg)
        clock.now += gap_s
    for _ in range(int(for_s)):
        clock.now += 1.0
        for msg in messages:
            monitor.handle(msg)
    clock.now += for_s - int(for_s)
    return monitor.stalled(LIMIT, world)


def culprit_line(report: str) -> str:
    return report.splitlines()[0]


@pytest.mark.parametrize("gap_s", [0.0, 0.9])
@pytest.mark.parametrize("order", list(itertools.permutations([HUNG_IN_LOSS,
                                                               WAITING_IN_BACKWARD])))
def test_the_rank_outside_the_collective_is_named_whichever_stopped_first(order, gap_s):
    report = stuck(list(order), gap_s=gap_s)
    head = culprit_line(report)
    assert head.startswith("watchdog: no progress for 4s; likely cause: rank 1 at step 19 "
                           "(computing the loss, epoch 1 step 20), not inside a collective")
    assert "rank 0" not in head
    # every rank on a line of its own, with its position and whether it waits
    lines = report.splitlines()[1:]
    assert len(lines) == 2
    assert lines[0].strip().startswith("rank 0 at step 19 (backward pass, epoch 1 step 20), "
                                       "waiting in DDP's gradient allreduce")
    assert lines[1].strip().startswith("rank 1 at step 19 (computing the loss")


def test_a_rank_stuck_reading_data_is_named_over_a_rank_in_the_epoch_allreduce():
    report = stuck([beat(0, 42, "exchanging epoch statistics",
                         "the epoch statistics allreduce"),
                    beat(1, 40, "reading data")])
    assert "likely cause: rank 1 at step 40 (reading data" in culprit_line(report)


def test_among_ranks_outside_collectives_the_least_advanced_is_named():
    # local SGD: rank 0 is outside any collective further on while rank 1 is stuck behind
    report = stuck([beat(0, 30, "forward pass"), beat(1, 20, "computing the loss"),
                    beat(2, 30, "averaging", "averaging the model")], world=3)
    head = culprit_line(report)
    assert "likely cause: rank 1 at step 20" in head
    assert "rank 0" not in head and "rank 2" not in head


def test_equal_evidence_names_every_tied_rank():
    head = culprit_line(stuck([beat(0, 5, "forward pass"), beat(1, 5, "computing the loss")]))
    assert "rank 0 at step 5" in head and "rank 1 at step 5" in head


def test_when_every_rank_waits_in_a_collective_the_least_advanced_is_named():
    report = stuck([beat(0, 9, "backward pass", "DDP's gradient allreduce"),
                    beat(1, 8, "exchanging epoch statistics", "the epoch statistics allreduce")])
    head = culprit_line(report)
    assert "likely cause: rank 1 at step 8" in head and "rank 0" not in head


def test_a_rank_that_never_reported_is_always_named():
    report = stuck([beat(0, 0, "running", "init_process_group (waiting for every rank to "
                                          "join)", epoch=None),
                    beat(2, 0, "building the model", epoch=None)], world=3)
    head = culprit_line(report)
    assert "rank 1 never reported" in head
    assert "rank 2 at step 0 (building the model)" in head  # outside a collective too
    assert "rank 0" not in head
    assert len(report.splitlines()) == 4


def test_a_rank_whose_heartbeats_stopped_is_named_with_how_long_ago():
    clock = Clock()
    monitor = StageMonitor(clock=clock)
    both = [beat(0, 3, "backward pass", "DDP's gradient allreduce"),
            beat(1, 3, "backward pass", "DDP's gradient allreduce")]
    for msg in both:
        monitor.handle(msg)
    for _ in range(6):  # rank 0 keeps beating at the same position; rank 1 has gone quiet
        clock.now += 1.0
        monitor.handle(both[0])
    head = culprit_line(monitor.stalled(LIMIT, 2))
    assert "likely cause: rank 1 at step 3" in head and "(no heartbeat for 6.0s)" in head
    assert "rank 0" not in head


def test_a_rank_lost_before_its_first_heartbeat_is_lost_counting_from_its_hello():
    """A warm rank can finish epochs within its first second; should its host drop then,
    before its first heartbeat, it is found lost as one that was heard once."""
    clock = Clock()
    monitor = StageMonitor(clock=clock)
    for rank in (0, 1):
        monitor.handle(Message(rank=rank, header={"type": "hello", "rank": rank,
                                                  "host": f"10.0.0.{rank + 1}",
                                                  "executor": str(rank)}))
    for _ in range(int(HEARTBEAT_LOST_S)):  # rank 0 beats; rank 1 never does
        clock.now += 1.0
        monitor.handle(beat(0, 3, "training"))
        assert monitor.lost() == []
    clock.now += 1.0
    [lost] = monitor.lost()
    assert lost.rank == 1 and lost.host == "10.0.0.2"
    assert lost.status == {"lost": True, "executor": "1"}
    assert "no heartbeat for 11s" in lost.message


def test_no_verdict_before_the_limit_or_before_any_rank_started():
    assert stuck([HUNG_IN_LOSS, WAITING_IN_BACKWARD], for_s=LIMIT - 1) == ""
    assert StageMonitor().stalled(LIMIT, 2) == ""


def test_finished_ranks_are_neither_stuck_nor_named():
    clock = Clock()
    monitor = StageMonitor(clock=clock)
    monitor.handle(beat(0, 50, "finished", "the closing barrier"))
    monitor.handle(Message(rank=0, header={"type": "done"}))
    for _ in range(6):
        clock.now += 1.0
        monitor.handle(beat(1, 49, "sending a snapshot to the driver"))
    report = monitor.stalled(LIMIT, 2)
    assert "likely cause: rank 1 at step 49" in culprit_line(report)
    assert "rank 0" not in report


def test_ranks_that_keep_moving_are_not_stalled():
    clock = Clock()
    monitor = StageMonitor(clock=clock)
    for steps in range(10):
        clock.now += 1.0
        monitor.handle(beat(0, steps, "forward pass"))
        monitor.handle(beat(1, steps, "forward pass"))
    assert monitor.stalled(LIMIT, 2) == ""


def test_no_verdict_until_the_rank_waited_for_has_stopped_for_the_limit():
    # rank 0 waits in DDP from t=0; rank 1 (what it waits for) stopped 0.9 s later
    clock = Clock()
    monitor = StageMonitor(clock=clock)
    monitor.handle(WAITING_IN_BACKWARD)
    clock.now += 0.9
    monitor.handle(HUNG_IN_LOSS)
    clock.now += LIMIT - 0.5  # rank 0 is past the limit, rank 1 not yet
    monitor.handle(WAITING_IN_BACKWARD)
    monitor.handle(HUNG_IN_LOSS)
    assert monitor.stalled(LIMIT, 2) == ""
    clock.now += 1.0
    assert "likely cause: rank 1 at step 19" in culprit_line(monitor.stalled(LIMIT, 2))


def starting(rank: int) -> Message:
    msg = beat(rank, 0, "starting (importing torch)", epoch=None)
    msg.header["starting"] = True
    return msg


def test_a_rank_still_starting_gets_the_start_limit_and_its_peers_wait_for_it():
    # rank 0 joined and waits in init_process_group; rank 1's Python worker is slow to start
    waiting = beat(0, 0, "running", "init_process_group (waiting for every rank to join)",
                   epoch=None)
    assert stuck([waiting, starting(1)], for_s=LIMIT * 5) == ""
    report = stuck([waiting, starting(1)], for_s=START_LIMIT_S + 1)
    assert "likely cause: rank 1 at step 0 (starting (importing torch))" in culprit_line(report)


def test_a_rank_that_never_reports_gets_the_start_limit_too():
    waiting = beat(0, 0, "running", "init_process_group (waiting for every rank to join)",
                   epoch=None)
    assert stuck([waiting], for_s=LIMIT * 5) == ""
    assert "rank 1 never reported" in culprit_line(stuck([waiting], for_s=START_LIMIT_S + 1))


def test_a_rank_that_keeps_moving_is_waited_for():
    # SSP: the fast rank waits at the staleness bound while the slow one still steps
    clock = Clock()
    monitor = StageMonitor(clock=clock)
    waiting = beat(0, 9, "optimizer step", "a pull from the SSP parameter server")
    for steps in range(10):
        clock.now += 1.0
        monitor.handle(waiting)
        monitor.handle(beat(1, steps, "forward pass"))
    assert monitor.stalled(LIMIT, 2) == ""


# ---- the end of a stage: every rank's last frame handled ----

def test_a_finished_stage_waits_for_each_ranks_done_or_its_connection_end():
    import threading
    import time

    from sparkddl.channel import messages as m
    monitor = StageMonitor()
    monitor.handle(Message(0, m.Done().header()))
    monitor.handle(Message(1, m.Closed(dropped=True).header()))  # unheard from now on
    assert monitor.wait_finished(3, timeout_s=0.2) == [2]  # rank 2: nothing yet
    late = threading.Timer(0.3, monitor.handle, [Message(2, m.Done().header())])
    late.start()
    started = time.monotonic()
    assert monitor.wait_finished(3, timeout_s=10) == []
    assert time.monotonic() - started < 5  # woken by the frame, not the limit
    late.join()
    # rank 1's frames may be lost: named for the warning, but it did not die
    assert monitor.closed_without_done(3) == [1]
    assert monitor.died_silently(time.monotonic()) == [] and monitor.accounted() == 0


def test_auto_limit_is_twenty_slowest_steps_and_at_least_a_minute():
    """watchdogTimeout='auto': 300 s up to the first step; then max(60 s, 20x the slowest
    move seen)."""
    from sparkddl.launch.monitor import AUTO_FLOOR_S
    clock = Clock()
    monitor = StageMonitor(clock=clock)
    monitor.handle(beat(0, 0, "reading the first batch"))
    clock.now += START_LIMIT_S - 1
    assert monitor.stalled("auto", 1) == ""  # before the first step: the start budget
    clock.now += 2
    assert "no progress for 60s" in monitor.stalled("auto", 1)
    for steps in range(1, 4):  # steps of 5 s each
        clock.now += 5.0
        monitor.handle(beat(0, steps, "computing the loss"))
    assert monitor.auto_limit() == 100.0
    clock.now += 99
    assert monitor.stalled("auto", 1) == ""
    clock.now += 2
    report = monitor.stalled("auto", 1)
    assert report.startswith("watchdog: no progress for 100s (watchdogTimeout='auto': 20x the "
                             "slowest step seen, 5.0s, at least 60s); likely cause: rank 0")
    fast = StageMonitor(clock=clock)
    fast.handle(beat(0, 1, "x"))
    clock.now += 0.1
    fast.handle(beat(0, 2, "x"))
    assert fast.auto_limit() == AUTO_FLOOR_S
