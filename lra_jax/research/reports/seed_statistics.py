"""Tests on seeds: is a difference between two arms more than seed noise, and do two rankings agree.

Each arm is a set of seeds summarised as (mean, sample std with ddof 1, number of seeds). The reports that
compare arms (self-pretrained against scratch, one recipe against another) call a difference only where
Welch's two-sided t-test, Holm-corrected over every comparison of the family, gives p below `ALPHA`.

    Welch:   t = (m_a - m_b) / sqrt(v_a + v_b),  v = s²/n,
             df = (v_a + v_b)² / (v_a²/(n_a - 1) + v_b²/(n_b - 1)),  p = 2 P(T_df > |t|)
    Holm:    the i-th smallest of m p-values becomes max over j <= i of min(1, (m - j + 1) p_(j))
    Kendall: tau-b = (C - D) / sqrt((C + D + T_x)(C + D + T_y))
"""

from __future__ import annotations

import dataclasses
import math

from scipy import stats

ALPHA = 0.05  # family-wise error rate: a difference is claimed where the Holm-adjusted p is below it


@dataclasses.dataclass(frozen=True)
class Welch:
    """Welch's t-test of arm a against arm b: t, its degrees of freedom and the two-sided p."""
    difference: float  # mean a - mean b, in the arms' units
    t: float
    df: float
    p: float


def welch(a: tuple[float, float | None, int], b: tuple[float, float | None, int]) -> Welch | None:
    """Welch's two-sided t-test from each arm's (mean, sample std, seeds). None (no test) where an arm has
    fewer than two seeds, or where neither arm varies over its seeds and the means differ (no spread to test
    against); equal means without spread test as p = 1."""
    arms = (a, b)
    if any(std is None or n < 2 for _, std, n in arms):
        return None
    difference = a[0] - b[0]
    v = [std ** 2 / n for _, std, n in arms]
    if v[0] + v[1] == 0:
        return Welch(difference, 0.0, float("nan"), 1.0) if difference == 0 else None
    t = difference / math.sqrt(v[0] + v[1])
    df = (v[0] + v[1]) ** 2 / math.fsum(vi ** 2 / (n - 1) for vi, (_, _, n) in zip(v, arms))
    return Welch(difference, t, df, float(2.0 * stats.t.sf(abs(t), df)))


def holm(p: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment of m p-values (Holm 1979); rejecting where the adjusted p < alpha holds
    the chance of any false claim among the m at alpha."""
    order = sorted(p, key=lambda k: (p[k], k))
    adjusted, running = {}, 0.0
    for i, key in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * p[key]))
        adjusted[key] = running
    return adjusted


def kendall_tau(xs: list[float], ys: list[float]) -> float | None:
    """Kendall's tau-b of two rankings of the same items (ties in either counted as in neither pair);
    None for fewer than two items or a ranking that is all ties."""
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            dx, dy = xs[i] - xs[j], ys[i] - ys[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    pairs = concordant + discordant
    denominator = math.sqrt((pairs + ties_x) * (pairs + ties_y))
    return None if denominator == 0 else (concordant - discordant) / denominator


def p_text(value: float | None) -> str:
    """A p-value as tables print it: two significant digits, scientific below 0.001, '—' for none."""
    return "—" if value is None else f"{value:.2g}" if value >= 0.001 else f"{value:.1e}"
