from sparkddl.errors import RankFailure, TrainingFailedError
from sparkddl.launch.monitor import (
    DIED_SILENTLY,
    failures_from_spark_error,
    ordered_failures,
    unreported_failures,
)


def test_failure_message_lists_first_failure_first_with_tracebacks():
    err = TrainingFailedError([RankFailure(1, "ValueError: bad", "Traceback...\nValueError: bad"),
                               RankFailure(0, "RuntimeError: peer gone")])
    text = str(err)
    assert err.ranks == [0, 1]
    assert text.index("rank 1") < text.index("rank 0")
    assert "(first to fail)" in text and "Traceback...\nValueError: bad" in text


SPARK_TEXT = """org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover
from a failed barrier ResultStage. Most recent failure reason: Stage failed because barrier task
ResultTask(3, 1) finished unsuccessfully.
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "x.py", line 3, in f
ZeroDivisionError: division by zero
\tat org.apache.spark.api.python.BasePythonRunner.foo(PythonRunner.scala:1)
"""


def test_rank_and_traceback_recovered_from_spark_error_text():
    [failure] = failures_from_spark_error(SPARK_TEXT)
    assert failure.rank == 1
    assert failure.message == "ZeroDivisionError: division by zero"
    assert failure.traceback.startswith("Traceback") and "PythonRunner" not in failure.traceback


def test_crashed_worker_text():
    text = ("Lost task 0.0 in stage 2.0 (TID 5) (host executor 1): "
            "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)")
    [failure] = failures_from_spark_error(text)
    assert failure.rank == 0 and "exited unexpectedly" in failure.message


EXECUTOR_LOST = """org.apache.spark.SparkException: Job aborted due to stage failure: \
Could not recover \
from a failed barrier ResultStage. Most recent failure reason: Stage failed because barrier task \
ResultTask(6, 1) finished unsuccessfully.
ExecutorLostFailure (executor 0 exited caused by one of the running tasks) Reason: Command exited \
with code 137
"""


def test_a_rank_whose_executor_died_is_named_first_with_what_spark_saw():
    peer = RankFailure(0, "RuntimeError: Connection closed by peer", "Traceback ...")
    [lost] = unreported_failures(EXECUTOR_LOST, [peer])
    assert lost.rank == 1 and lost.message.startswith("ExecutorLostFailure (executor 0 exited")
    assert str(TrainingFailedError([lost, peer])).splitlines()[1].startswith(
        "--- rank 1 (first to fail): ExecutorLostFailure")
    assert unreported_failures(EXECUTOR_LOST, [peer, RankFailure(1, "x")]) == []


def test_a_peers_traceback_quoted_by_spark_is_not_pinned_on_the_silent_rank():
    peer = RankFailure(0, "ZeroDivisionError: division by zero", "Traceback ...")
    [silent] = unreported_failures(SPARK_TEXT, [peer])
    assert silent.rank == 1 and silent.traceback == ""
    assert "ZeroDivisionError" not in silent.message
    [alone] = unreported_failures(SPARK_TEXT, [])  # nobody reported: Spark's traceback is its
    assert alone.rank == 1 and alone.message == "ZeroDivisionError: division by zero"


def test_the_cause_comes_first():
    peer = RankFailure(0, "ZeroDivisionError: division by zero", "Traceback ...")
    # rank 1 died without a report: first, with what Spark says of its executor
    order = ordered_failures(EXECUTOR_LOST, [peer], dead=[1])
    assert [f.rank for f in order] == [1, 0] and "ExecutorLostFailure" in order[0].message
    # died, and Spark's error says nothing of it (the stage was cancelled first)
    order = ordered_failures("Job 3 cancelled part of cancelled job group", [peer], dead=[1])
    assert [(f.rank, f.message) for f in order] == [(1, DIED_SILENTLY), (0, peer.message)]
    # not dead, only named by Spark with a peer's traceback: after the real report
    order = ordered_failures(SPARK_TEXT, [peer], dead=[])
    assert [f.rank for f in order] == [0, 1] and order[0] is peer


def test_every_sparkddl_error_survives_pickling():
    """Spark, Connect, pyspark's tuning pools and multiprocessing move exceptions so."""
    import inspect
    import pickle

    from sparkddl import errors
    failed = TrainingFailedError([RankFailure(1, "ValueError: bad", "tb", "10.0.0.2 (host a)",
                                              {"steps": 3})], "spark text", 2, "why")
    back = pickle.loads(pickle.dumps(failed))
    assert str(back) == str(failed) and back.failures == failed.failures
    assert (back.spark_error, back.attempts, back.reason) == ("spark text", 2, "why")
    simple = [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
              if issubclass(cls, errors.SparkDDLError) and cls is not TrainingFailedError]
    assert len(simple) >= 8
    for cls in simple:
        err = pickle.loads(pickle.dumps(cls("what was wrong")))
        assert type(err) is cls and str(err) == "what was wrong"


def test_a_note_is_added_on_every_python_the_package_supports():
    """Python 3.10 has no BaseException.add_note: the note goes to __notes__ there (where
    3.11's tracebacks look), never an AttributeError instead of the user's error."""
    from sparkddl.errors import add_note

    class Old(Exception):  # an exception as Python 3.10 has them
        def __getattribute__(self, name):
            if name == "add_note":
                raise AttributeError(name)
            return super().__getattribute__(name)

    for exc in (ValueError("boom"), Old("boom")):
        add_note(exc, "first")
        add_note(exc, "second")
        assert exc.__notes__ == ["first", "second"]
