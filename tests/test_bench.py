"""The pure parts of :mod:`attnsvm.bench`: the per-round ratio statistics and the table formatting.

Timings themselves are never asserted (benchmarks only); ``attnsvm bench --tiny`` is run end to
end in ``tests/test_cli.py``.
"""

from __future__ import annotations

import pytest

from attnsvm.bench import _r, gd_table, median_ratio, svm_table


def test_median_ratio_is_the_median_of_per_round_ratios() -> None:
    # rounds (num, den): per-round ratios 2, 10, 4 -> median 4, range 2..10
    num, den = [2.0, 10.0, 8.0], [1.0, 1.0, 2.0]
    assert median_ratio(num, den) == (4.0, 2.0, 10.0)
    # ratio of medians would be median(num)/median(den) = 8/1 = 8: the per-round median differs
    assert median_ratio(num, den)[0] != 8.0
    assert median_ratio([3.0], [2.0], scale=4.0) == (6.0, 6.0, 6.0)
    # an even number of rounds: the mean of the two middle ratios
    assert median_ratio([1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]) == (2.5, 1.0, 4.0)


@pytest.mark.parametrize("num, den", [([], []), ([1.0], [1.0, 2.0])])
def test_median_ratio_rejects_unequal_or_empty(num: list[float], den: list[float]) -> None:
    with pytest.raises(ValueError, match="equal, non-empty"):
        median_ratio(num, den)


def test_tables_show_ranges_and_targets() -> None:
    row = {
        "bench": "svm", "method": "dual", "n": 6, "T": 8, "d": 1024, "time_s": 0.05,
        "time_range_s": [0.04, 0.07], "runs": 5, "solver_time_s": None, "raw_rel_error": None,
        "rel_error": 0.0, "certified": True, "error_bound": None, "time_over_dual": 1.0,
    }  # fmt: skip
    text = svm_table([row])
    assert "0.04..0.07" in text and "target dual d=1024 <= 0.1 s: 0.05 s (median of 5)" in text
    gd = gd_table([_r("ratio", 150.0, "x", "median", (120.0, 180.0)), _r("threads", 2, "", "both")])
    assert "120..180" in gd and "threads" in gd
