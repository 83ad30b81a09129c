"""Bootstrap intervals for the median of paired ratios (pure; used by the benchmarks).

A ratio of one server's speed to another's, taken round by round while both are up, varies
in two ways on a shared machine: from round to round (another process takes a core for a
while), and from one pair of server processes to the next. The second is measured: two
identical llama-servers from the same binary, started together and taking turns for 12
rounds, differed by 1.6%, 0.9%, 0.1% and -0.9% in four fresh starts on this 2-core machine,
each run's own interval far narrower than that. Where a process's memory lands, which of
its threads share a core: what a start draws stays for the process's life. Rounds within one
start therefore cannot tell "ahead" from "level" however many there are, and `--epochs`
starts the servers afresh several times; `clustered_median_interval` then resamples the
starts as well as the rounds within them.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence


def median_interval(ratios: Sequence[float], seed: int = 0, draws: int = 4000) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval for the median of `ratios`: whether a median
    ratio of 1.01 on a noisy machine says "ahead" or only "level"."""
    if not ratios:
        raise ValueError("no ratios")
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]


def clustered_median_interval(
    groups: Sequence[Sequence[float]], seed: int = 0, draws: int = 4000
) -> tuple[float, float]:
    """A 95% two-stage bootstrap interval for the median of all ratios, which come in
    groups (one per start of the servers): each draw picks as many groups as there are,
    with replacement, then as many ratios from each picked group as it holds, and takes
    the median of the lot. Between-start variation widens the interval as it should; with
    one group this is `median_interval`."""
    groups = [list(g) for g in groups if g]
    if not groups:
        raise ValueError("no ratios")
    if len(groups) == 1:
        return median_interval(groups[0], seed, draws)
    rng = random.Random(seed)
    meds = []
    for _ in range(draws):
        pooled: list[float] = []
        for g in rng.choices(groups, k=len(groups)):
            pooled.extend(rng.choices(g, k=len(g)))
        meds.append(statistics.median(pooled))
    meds.sort()
    return meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]
