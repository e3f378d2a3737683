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


def test_the_ranks_are_up_when_the_last_says_hello_on_its_own_channel():
    from types import SimpleNamespace

    from sparkddl.launch.phases import Arrivals

    clock = Clock()
    arrivals = Arrivals(2, clock)

    def hello(rank: int, at: float, role: str = "") -> None:
        clock.t = at
        arrivals(SimpleNamespace(rank=rank), SimpleNamespace(role=role))

    hello(1, 101.0)
    hello(0, 101.5, role="last-words")  # a rank's second connection: not its start
    assert arrivals.all_up_at is None
    hello(1, 102.0)  # said again: the first time counts
    hello(0, 103.0)
    assert arrivals.all_up_at == 103.0
    arrivals.reset(3)  # a relaunch on three
    hello(0, 104.0)
    assert arrivals.all_up_at is None
    assert Arrivals(0, clock).all_up_at is None  # no stage yet
