from __future__ import annotations

from sparkddl.launch.phases import Phases


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_phases_add_up_to_the_wall_clock_in_order_and_a_repeated_phase_adds():
    clock = Clock()
    phases = Phases(clock)
    clock.t = 101.5
    phases.end("checks")
    up = 102.0  # an event seen by another thread, before the phase was closed
    clock.t = 104.0
    phases.end("launch", up)
    phases.end("training")
    clock.t = 105.0
    phases.end("launch", None)  # a relaunch: its time adds to the first launch's
    assert phases.seconds == {"checks": 1.5, "launch": 1.5, "training": 2.0}
    assert phases.total_s == 5.0 == sum(phases.seconds.values())
    # an event from before the last phase's end adds nothing and moves nothing back
    phases.end("start", 101.0)
    assert phases.seconds["start"] == 0.0 and phases.total_s == 5.0
    assert phases.line() == ("5.00 s: checks 1.50 s, launch 1.50 s, training 2.00 s, "
                             "start 0.00 s")
