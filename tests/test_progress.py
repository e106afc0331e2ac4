"""A progress bar written to a log (not a terminal): whole lines, no carriage returns."""

import io
import sys

from lra_jax import progress


def test_a_bar_in_a_log_is_whole_lines_at_each_validation_and_at_the_end(monkeypatch):
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    bar = progress.bar(4, "softmax listops")
    assert bar.mininterval == progress.LOG_INTERVAL
    for step in range(4):
        bar.update(1)
        if step in (1, 3):
            bar.set_postfix({"best_val": f"0.{step}00"})  # a validation: a line at once, whatever the interval
    bar.close()
    text = log.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and len(lines) == 4, text  # the start, two validations, the close
    assert lines[0].startswith("softmax listops:   0%") and "2/4" in lines[1] and "best_val=0.100" in lines[1]
    assert all("4/4" in line and "best_val=0.300" in line for line in lines[2:])


def test_a_disabled_bar_writes_nothing(monkeypatch):
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    bar = progress.bar(3, "softmax listops", disable=True)
    bar.update(3)
    bar.close()
    assert log.getvalue() == ""
