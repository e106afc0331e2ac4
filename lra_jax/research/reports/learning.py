"""Whether a seed learned its task: its test accuracy clearly above the task's chance rate.

A run that learned nothing predicts one class (or guesses) and scores the test set's majority-class rate,
or near it: on mini Pathfinder, 50.7% (one class) or 49.3% (the other). Averaging such a seed with seeds
that did learn gives a middle value that describes no run, so every table says how many seeds learned.

    learned  <=>  test accuracy >= test majority-class rate + LEARNED_MARGIN

The rate is the one each run records (results.json "test_majority_class_rate": the share of the commonest
label in its test set). LEARNED_MARGIN, 5 percentage points, is well clear of chance: a guesser's accuracy
on N test examples has a standard deviation of at most 0.5/sqrt(N), 1.4 points on mini Pathfinder's 1,200
examples and 1.6 on mini ListOps' 1,000, so 5 points is over 3 of them; on mini Pathfinder it puts the line
at 55.7%, about the 56% at which a Pathfinder run is read as having learned. A run that records no rate is
counted neither way.
"""

from __future__ import annotations

from typing import Any

LEARNED_MARGIN = 0.05  # accuracy (fraction) above the test majority-class rate that counts as learned


def learned(test_accuracy: float, majority_rate: float | None) -> bool | None:
    """Whether one seed learned (None: its run records no majority-class rate)."""
    if majority_rate is None:
        return None
    return test_accuracy >= majority_rate + LEARNED_MARGIN


def learned_seeds(chosen: Any) -> tuple[int, int] | None:
    """(seeds that learned, seeds judged) of a `selection.Selection`; None where no seed can be judged."""
    verdicts = [learned(t, m) for t, m in zip(chosen.seed_tests, chosen.seed_majority_rates)]
    judged = [v for v in verdicts if v is not None]
    return (sum(judged), len(judged)) if judged else None


def learned_note(counts: tuple[int, int] | None) -> str:
    """', 2/3 learned' where some judged seed did not learn; '' where every one did or none is judged."""
    if counts is None or counts[0] == counts[1]:
        return ""
    return f", {counts[0]}/{counts[1]} learned"
