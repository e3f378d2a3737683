"""Driver-side progress lines when stderr is not a terminal (as under spark-submit or CI)."""
from __future__ import annotations

import logging

from sparkddl.fit import progress as progress_mod


def test_log_lines_show_epoch_step_loss_and_samples_per_second(monkeypatch, caplog):
    monkeypatch.setattr(progress_mod.sys.stderr, "isatty", lambda: False)  # even under -s
    clock = [100.0]
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(progress_mod, "LOG_EVERY_S", 0.0)
    with caplog.at_level(logging.INFO, logger="sparkddl.progress"):
        p = progress_mod.Progress(epochs=3, steps_per_epoch=50, samples_per_step=64)
        p.update(1, 10, 2.5)
        clock[0] += 2.0
        p.update(1, 30, 1.25)  # 20 steps x 64 samples in 2 s
        clock[0] += 1.0
        p.update(1, 5, 1.0)  # a restarted attempt went back: the rate starts over
        p.epoch({"epoch": 1, "train_loss": 1.0, "samples_per_sec": 640.0})
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "epoch 1/3 step 10/50 loss 2.5000"  # no rate before a second passed
    assert lines[1] == "epoch 1/3 step 30/50 loss 1.2500 samples/s 640"
    assert lines[2] == "epoch 1/3 step 5/50 loss 1.0000"
    assert lines[3].startswith("epoch 1/3: train_loss 1, samples_per_sec 640")


def test_disabled_progress_says_nothing(monkeypatch, caplog):
    monkeypatch.setattr(progress_mod.sys.stderr, "isatty", lambda: False)
    with caplog.at_level(logging.INFO, logger="sparkddl.progress"):
        p = progress_mod.Progress(epochs=1, steps_per_epoch=5, enabled=False)
        p.update(1, 1, 0.5)
        p.epoch({"epoch": 1, "train_loss": 0.5})
    assert not caplog.records


def test_progress_goes_through_the_applications_logging_and_never_twice(monkeypatch, capsys):
    monkeypatch.setattr(progress_mod.sys.stderr, "isatty", lambda: False)
    root = logging.getLogger()
    saved = root.handlers[:]
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    try:
        root.handlers = []  # no logging set up: the fallback prints to stderr
        progress_mod.Progress(epochs=1, steps_per_epoch=5).epoch({"epoch": 1, "train_loss": 1.0})
        assert "sparkddl: epoch 1/1: train_loss 1" in capsys.readouterr().err
        root.handlers = [Collect()]  # set up: the application's handler gets it, once
        progress_mod.Progress(epochs=1, steps_per_epoch=5).epoch({"epoch": 1, "train_loss": 2.0})
        assert seen == ["epoch 1/1: train_loss 2"]
        assert "train_loss 2" not in capsys.readouterr().err
    finally:
        root.handlers = saved
