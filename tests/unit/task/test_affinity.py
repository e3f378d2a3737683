import os
import threading

import pytest

from sparkddl.task.affinity import pinned, rank_cpus


def test_ranks_on_a_host_get_disjoint_blocks_of_its_cpus():
    cpus = list(range(8))
    blocks = [rank_cpus(cpus, r, 4, threads=2) for r in range(4)]
    assert blocks == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert rank_cpus([0, 2, 4, 6, 8], 1, 2, threads=1) == [4, 6]  # 5 CPUs: one left over


def test_no_pinning_where_ranks_cannot_have_cores_of_their_own():
    assert rank_cpus([0, 1], 0, 1, threads=1) is None  # one rank has every core already
    assert rank_cpus([0, 1], 1, 2, threads=2) is None  # 2 ranks x 2 threads on 2 cores
    assert rank_cpus([0, 1, 2], 2, 4, threads=1) is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and 2 CPUs")
@pytest.mark.timeout(30)
def test_every_thread_is_pinned_and_given_back():
    before = os.sched_getaffinity(0)
    ready, release = threading.Event(), threading.Event()
    seen = {}

    def worker():
        ready.set()
        release.wait(10)
        seen["cpus"] = os.sched_getaffinity(0)

    t = threading.Thread(target=worker)
    t.start()
    ready.wait(10)
    with pinned(1, 2, threads=1) as cpus:
        assert cpus == rank_cpus(sorted(before), 1, 2, 1)
        assert os.sched_getaffinity(0) == set(cpus)
        release.set()  # a thread started before the pinning keeps to the rank's CPUs too
        t.join(10)
        assert seen["cpus"] == set(cpus)
    assert os.sched_getaffinity(0) == before
