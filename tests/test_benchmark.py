"""Benchmark bookkeeping: re-measuring one model keeps the committed rows of the others."""

import pandas as pd

from prunelab.benchmark import keep_unmeasured_rows


def test_keep_unmeasured_rows_replaces_measured_models_only(tmp_path):
    previous = tmp_path / "bench.csv"
    pd.DataFrame({"model": ["small", "small", "big"], "seconds": [1.0, 2.0, 300.0]}).to_csv(previous, index=False)
    fresh = pd.DataFrame({"model": ["small"], "seconds": [0.5]})
    merged = keep_unmeasured_rows(fresh, previous)
    assert merged.to_dict("records") == [{"model": "small", "seconds": 0.5}, {"model": "big", "seconds": 300.0}]
    assert keep_unmeasured_rows(fresh, tmp_path / "missing.csv").equals(fresh)
