"""Choosing among timed candidates on a shared, noisy machine: a one-repeat screen of all, then the finalists
timed in alternating rounds against the model's first plan, which a challenger replaces only by a margin."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from roller.measure.timing import paired_ratio


# ... and each repeat of the screen (time_finalists), which only picks the finalists within FINALIST_RATIO of
# the best: 0.3 s less of a ~3 s top-10 build (ten screens), where the finalists' rounds decide.
SCREEN_SECONDS = 0.02


REPEATS = 5


FINALISTS = 3      # candidates re-timed with REPEATS repeats after a one-repeat screen of all


FINALIST_RATIO = 1.15  # ... when their screen time is within this ratio of the best


# A finalist replaces the model's first plan only where it ran at least this much faster in the same rounds
# (time_finalists): smaller gaps are the noise of a shared machine, and the model's ranking breaks the tie.
WIN_MARGIN = 0.03


@dataclass(frozen=True)
class Timing:
    """What :func:`time_finalists` measured: seconds a call per candidate (the finalists' medians over the
    rounds, the others' screen) and the candidate it chose."""

    seconds: dict[int, float]
    best: int | None  # None when there was nothing to time


def time_finalists(timers: Mapping[int, Callable[[], float]],
                   screens: Mapping[int, Callable[[], float]] | None = None) -> Timing:
    """Seconds per candidate from ``timers`` (index -> one timed repeat, seconds a call) and the choice: one
    repeat each screens them all; then the finalists (the model's first plan, and the few others within
    FINALIST_RATIO of the best screen) are timed in REPEATS rounds, one repeat of each per round (fewer
    where no challenger can win any more, :func:`_all_lose`).
    Alternating, every finalist sees the same drift of a shared machine: timed one after another, a burst of
    other work during one candidate's repeats made a slower plan win. The choice compares each finalist with
    the model's first plan round by round (its time over the first plan's in the same round, the median over
    the rounds), and a challenger wins only where it is at least WIN_MARGIN faster: on a machine whose speed
    moves within seconds, plans within the noise of each other are otherwise picked at random
    (docs/design-notes.md#finalists-time_finalists). Any device: the CPU's runtime
    here, a GPU's in roller.targets.cuda.profile. ``screens`` (index -> a shorter timed repeat) time the screen where
    given."""
    screen = {i: (screens or timers)[i]() for i in timers}
    if not screen:
        return Timing(screen, None)
    best = min(screen.values())
    close = sorted((i for i in screen if screen[i] <= best * FINALIST_RATIO), key=screen.get)[:FINALISTS]
    first = min(screen)  # the model's best-ranked plan that built and verified
    finalists = [first] + [i for i in close if i != first]
    if len(finalists) == 1:
        return Timing(screen, first)
    rounds: dict[int, list[float]] = {i: [] for i in finalists}
    for _ in range(REPEATS):
        for i in finalists:
            rounds[i].append(timers[i]())
        if _all_lose(rounds, first):
            break
    for i in finalists:
        screen[i] = float(np.median(rounds[i]))
    paired = {i: paired_ratio(rounds[i], rounds[first]) for i in finalists[1:]}
    challenger = min(paired, key=paired.get)
    return Timing(screen, challenger if paired[challenger] <= 1 - WIN_MARGIN else first)


def _all_lose(rounds: Mapping[int, list[float]], first: int) -> bool:
    """Whether no challenger can win whatever the rounds still to run give: each has more than half of
    REPEATS rounds in which it was not WIN_MARGIN faster than the model's first plan, so the median of
    its ratios over all the rounds cannot be either. The choice is then made (the first plan), and the
    rounds left are skipped: most builds, where the model's first plan wins, time 3 rounds instead of 5
    (0.2-0.4 s of a ~3 s build)."""
    base = rounds[first]
    return all(sum(t / b > 1 - WIN_MARGIN for t, b in zip(times, base)) > REPEATS // 2
               for i, times in rounds.items() if i != first)


TARGET_MEASURE_SECONDS = 0.05  # each timed repeat runs the kernel ~this long in total
