"""The tests on seeds that the comparison reports share: Welch's t-test against scipy on the seeds
themselves, Holm's step-down adjustment, Kendall's tau-b with ties."""

import pytest
from scipy import stats

from lra_jax.research.reports import seed_statistics


def summary(seeds):
    mean = sum(seeds) / len(seeds)
    return mean, (sum((x - mean) ** 2 for x in seeds) / (len(seeds) - 1)) ** 0.5, len(seeds)


def test_welch_from_summaries_matches_scipy_on_the_seeds_and_refuses_what_it_cannot_test():
    a, b = [41.0, 42.5, 44.0, 40.0], [39.0, 40.0, 40.5]
    w = seed_statistics.welch(summary(a), summary(b))
    reference = stats.ttest_ind(a, b, equal_var=False)
    assert w.t == pytest.approx(reference.statistic) and w.p == pytest.approx(reference.pvalue)
    assert w.difference == pytest.approx(sum(a) / 4 - sum(b) / 3)
    assert seed_statistics.welch((50.0, None, 1), summary(b)) is None  # one seed: no spread
    assert seed_statistics.welch((50.0, 0.0, 3), (50.0, 0.0, 3)).p == 1.0
    assert seed_statistics.welch((51.0, 0.0, 3), (50.0, 0.0, 3)) is None  # differ, no spread to test against


def test_holm_adjusts_step_down_with_a_running_maximum():
    adjusted = seed_statistics.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005})
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max
    assert adjusted == pytest.approx({"d": 0.02, "a": 0.03, "c": 0.06, "b": 0.06})
    assert seed_statistics.holm({"a": 0.6, "b": 0.9}) == pytest.approx({"a": 1.0, "b": 1.0})


def test_kendall_tau_b_of_agreeing_reversed_and_tied_orders():
    assert seed_statistics.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert seed_statistics.kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert seed_statistics.kendall_tau([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(4 / 6)  # 1 of 6 discordant
    # a tie in x: C = 5, D = 0, Tx = 1, Ty = 0; tau-b = (C - D) / sqrt((C + D + Tx)(C + D + Ty))
    assert seed_statistics.kendall_tau([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / (6 * 5) ** 0.5)
    assert seed_statistics.kendall_tau([1], [1]) is None and seed_statistics.kendall_tau([2, 2], [1, 1]) is None
