"""Cost tables from the records' pruning_cost and efficiency sections: medians over seeds, the
recovery's share of the time that removing layers saved."""

from __future__ import annotations

import pandas as pd
import pytest

from prunelab.analysis.costs import cost_frame, cost_table, write_cost_tables
from prunelab.analysis.records import RunRecord


def record(seed: int, recovery: str, speedup: float, score_s: float, passes: float = 1.0) -> RunRecord:
    flops = 0.75 if recovery == "ghosted" else 0.7  # the operators' matmuls
    cost = {"num_layers": 18, "calibration_tokens": 100,
            "stages": {"score": {"seconds": score_s, "forward_passes": passes, "backward_passes": 0.0},
                       "prune": {"seconds": 0.1, "forward_passes": 0.0, "backward_passes": 0.0},
                       "recover": {"seconds": 0.5, "forward_passes": 0.6, "backward_passes": 0.0}},
            "total": {"forward_passes": passes + 0.6, "backward_passes": 0.0}}
    efficiency = {"measured": True, "speedup": {"prefill": speedup, "decode": speedup},
                  "counted": {"ratio": {"flops_prefill": flops, "parameters": 0.75, "kv_bytes_per_token": 0.67}}}
    labels = {"model": "m", "method": "depth", "layers_removed": 6, "scorer": "block_influence",
              "recovery": recovery}
    return RunRecord(f"r{seed}{recovery}", {"signature": recovery, "seed": seed, "status": "completed",
                                           "labels": labels, "pruning_cost": cost, "efficiency": efficiency})


@pytest.fixture
def records():
    speeds = {"none": (2.0, 1.9, 2.2), "ghosted": (1.6, 1.5, 1.7)}
    return [record(seed, recovery, speeds[recovery][seed], score_s=1.0 + seed)
            for recovery in speeds for seed in range(3)]


def test_medians_over_seeds_and_the_recoverys_share_of_the_saving(records):
    table = cost_table(cost_frame(records)).set_index("labels.recovery")
    assert table.loc["none", "n"] == 3 and table.loc["none", "speedup_prefill"] == 2.0
    assert table.loc["ghosted", "first_stage_s"] == 2.0  # median of 1, 2, 3 seconds
    assert table.loc["none", "speedup_prefill_range"] == "1.90-2.20"
    # removal alone halves the time (s0 = 2); Ghosted's 1.6x spends (1/1.6 - 1/2) / (1 - 1/2) of it again
    assert table.loc["ghosted", "recovery_share_of_saving"] == pytest.approx((1 / 1.6 - 0.5) / 0.5)
    assert pd.isna(table.loc["none", "recovery_share_of_saving"])
    assert table.loc["ghosted", "recovery_share_of_saved_flops"] == pytest.approx((0.75 - 0.7) / (1 - 0.7))


def test_records_without_costs_write_nothing(tmp_path, records):
    bare = [RunRecord("x", {**r.data, "pruning_cost": None}) for r in records]
    assert write_cost_tables(bare, tmp_path) == []
    written = write_cost_tables(records, tmp_path)
    assert [p.name for p in written] == ["cost_table.md", "cost_table.csv"]
    assert "recovery_share_of_saving" in written[0].read_text()


def test_a_refinement_on_some_settings_splits_them_from_their_base(records):
    """Wanda + DSnoT beside Wanda: refine "dsnot" or missing; each gets its own median row."""
    for run in records:
        run.data["labels"] = {"model": "m", "method": "wanda", "sparsity": 0.5,
                              **({"refine": "dsnot"} if run.data["labels"]["recovery"] == "ghosted" else {})}
    table = cost_table(cost_frame(records))
    assert list(table["n"]) == [3, 3] and sorted(table["labels.refine"].fillna("")) == ["", "dsnot"]
    assert sorted(table["first_stage_s"]) == [2.0, 2.0]
