"""Driver <-> rank messages: every kind round-trips through its frame header (no Spark)."""
from __future__ import annotations

import json

import pytest

from sparkddl.channel import messages as m

EXAMPLES = [m.Hello(1, "h", 7), m.Rendezvous(4242), m.Log("stderr", True),
            m.Heartbeat("backward pass", 3, 1, 4, "DDP's gradient allreduce"),
            m.Error("RuntimeError: x", "Traceback ...", "h", {"steps": 3}), m.Done(),
            m.Progress(1, 2, 10, 0.5), m.Epoch({"epoch": 1, "train_loss": 0.1}),
            m.Snapshot(2, final=True, url="file:///s"), m.Checkpoint(2, 0, "file:///c"),
            m.Stop(3), m.Closed(), m.Stacks(), m.DumpStacks(), m.LastWords("h"),
            m.Hello(1, "h", 7, role=m.LAST_WORDS)]


def test_every_kind_is_covered_and_round_trips_as_json():
    assert {type(e) for e in EXAMPLES} == set(m.KINDS.values())
    for example in EXAMPLES:
        header = json.loads(json.dumps(example.header()))  # what the wire carries
        assert header["type"] == example.KIND
        assert m.parse(header) == example


def test_unknown_or_incomplete_headers_parse_to_none():
    assert m.parse({"type": "from-a-newer-rank", "x": 1}) is None
    assert m.parse({"type": "rendezvous"}) is None  # no port
    assert m.parse({}) is None


def test_a_heartbeat_takes_what_it_knows_of_a_rank_status():
    beat = m.Heartbeat.of({"phase": "reading data", "steps": 5, "epoch": 2, "extra": "x"})
    assert beat == m.Heartbeat("reading data", 5, 2, None, "")


@pytest.mark.parametrize("kind", sorted(m.KINDS))
def test_kinds_have_unique_names(kind):
    assert m.KINDS[kind].KIND == kind
