"""The interaction test: does a setting's paired effect against its baseline depend on the model?"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import PPL, acc_metric, ppl_metric, signature_for, write_record

from prunelab.analysis.cli import main
from prunelab.analysis.interaction import interaction_table, paired_differences
from prunelab.analysis.records import load_records, records_to_frame

SEEDS = range(6)


def _backbone_study(root, gap_by_model: dict[str, float]) -> None:
    """uniform and pals on each model, 6 seeds; pals' log-perplexity is `gap` above uniform's,
    plus seed noise common to both (paired) and a little of its own."""
    rng = np.random.default_rng(0)
    for model, gap in gap_by_model.items():
        for seed in SEEDS:
            common = rng.normal(0, 0.2)
            for allocation, shift in (("uniform", 0.0), ("pals", gap + rng.normal(0, 0.01))):
                labels = {"model": model, "method": "wanda", "sparsity": 0.5, "allocation": allocation}
                nll = np.full(8, 2.0 + common + shift)
                write_record(root, signature_for(model + allocation), seed, labels,
                             {PPL: ppl_metric(nll), "zeroshot/boolq/acc": acc_metric(np.ones(40))})


def test_an_effect_that_differs_across_models_is_found_and_a_shared_one_is_not(tmp_path):
    _backbone_study(tmp_path / "differs", {"llama": -0.10, "mistral": 0.0, "qwen": 0.0})
    _backbone_study(tmp_path / "shared", {"llama": -0.10, "mistral": -0.10, "qwen": -0.10})
    tables = {}
    for name in ("differs", "shared"):
        frame = records_to_frame(load_records([tmp_path / name]))
        tables[name] = interaction_table(frame, [PPL], "allocation=uniform").set_index("labels.allocation")
    differs, shared = tables["differs"].loc["pals"], tables["shared"].loc["pals"]
    assert differs["p_interaction"] < 1e-6 and shared["p_interaction"] > 0.01
    # each model's mean log ratio is its own effect (the common seed noise cancels in the pairing)
    assert differs["llama"][0] == pytest.approx(-0.10, abs=0.02) and differs["qwen"][0] == pytest.approx(0, abs=0.02)
    assert differs["llama"][3] == len(SEEDS) and differs["scale"] == "log ratio"


def test_only_seeds_that_both_ran_are_paired(tmp_path):
    _backbone_study(tmp_path, {"llama": -0.1, "qwen": 0.0})
    frame = records_to_frame(load_records([tmp_path]))
    frame = frame[~((frame["labels.allocation"] == "uniform") & (frame["seed"] == 0))]
    diffs = paired_differences(frame, [PPL], "allocation=uniform")
    assert sorted(diffs["seed"].unique()) == [1, 2, 3, 4, 5]


def test_a_model_that_lacks_a_setting_still_has_its_column_before_the_test(tmp_path):
    """A backbone run without one setting (here qwen without dlp, which sorts first) keeps its
    column with the other models', ahead of F and the p-values, and a dash where it did not run."""
    _backbone_study(tmp_path, {"llama": -0.10, "qwen": 0.0})
    for seed in SEEDS:
        labels = {"model": "llama", "method": "wanda", "sparsity": 0.5, "allocation": "dlp"}
        write_record(tmp_path, signature_for("llamadlp"), seed, labels,
                     {PPL: ppl_metric(np.full(8, 2.3 + 0.01 * seed))})
    table = interaction_table(records_to_frame(load_records([tmp_path])), [PPL], "allocation=uniform")
    columns = list(table.columns)
    assert columns.index("qwen") < columns.index("F") and columns.index("llama") < columns.index("F")
    dlp = table.set_index("labels.allocation").loc["dlp"]
    assert not isinstance(dlp["qwen"], tuple) and dlp["note"].startswith("fewer than two")


def test_the_cli_writes_the_interaction_table_and_its_figure(tmp_path):
    _backbone_study(tmp_path / "records", {"llama": -0.10, "qwen": 0.0})
    out = tmp_path / "out"
    assert main([str(tmp_path / "records"), "--out", str(out), "--metric", PPL, "--baseline", "allocation=uniform",
                 "--interaction", "model"]) == 0
    table = pd.read_csv(out / "interaction.csv")
    assert {"F", "p_interaction", "p_holm", "diff_mean[llama]", "n[qwen]"} <= set(table.columns)
    assert "p_interaction" in (out / "interaction.md").read_text()
    assert (out / "interaction_ppl-testbed-token.png").stat().st_size > 0


def test_interaction_without_a_label_baseline_is_one_line(tmp_path, capsys):
    _backbone_study(tmp_path / "records", {"llama": -0.10, "qwen": 0.0})
    assert main([str(tmp_path / "records"), "--out", str(tmp_path / "out"), "--interaction", "model"]) == 2
    assert "--interaction needs" in capsys.readouterr().err


def test_where_keeps_one_models_records(tmp_path):
    _backbone_study(tmp_path / "records", {"llama_7b": -0.10, "qwen": 0.0})
    out = tmp_path / "out"
    assert main([str(tmp_path / "records"), "--out", str(out), "--metric", PPL, "--where", "model=llama*",
                 "--no-plots"]) == 0
    assert set(pd.read_csv(out / "table.csv")["labels.model"].dropna()) == {"llama_7b"}
    assert main([str(tmp_path / "records"), "--out", str(out), "--where", "model"]) == 2
