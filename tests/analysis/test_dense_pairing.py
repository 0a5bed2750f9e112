"""Issue 13, item 6: dense references pair by model identity and protocol, never by label."""

import json

import numpy as np
import pytest
from conftest import PPL, WINDOWS, labels_for, ppl_metric, setting_metrics, signature_for, write_record

from prunelab.analysis import records, tables


def _with_model_key(path, key):
    record = json.loads(path.read_text())
    record["model"] = {"identity": {"source": key}, "key": key}
    path.write_text(json.dumps(record))


def test_two_models_under_one_label_get_their_own_dense_reference(tmp_path):
    """A retrained checkpoint run under the preset's label: its dense ppl (3.0) must not be the
    reference of the original model's setting (dense 4.5), nor the other way round."""
    for name, key, dense_nll in (("old", "aaaa", np.log(4.5)), ("new", "bbbb", np.log(3.0))):
        for seed in (0, 1):
            path = write_record(tmp_path, signature_for(name), seed, labels_for("uniform", 0.5),
                                {PPL: setting_metrics(0.5, seed, 0.5)[PPL]},
                                {PPL: ppl_metric(np.full(WINDOWS, dense_nll))})
            _with_model_key(path, key)
    frame = records.records_to_frame(records.load_records([tmp_path]))
    summary = tables.build_summary(frame, [PPL])
    dense = summary[summary["is_dense"]]
    assert sorted(dense["mean"].round(6)) == [3.0, 4.5]
    for name, expected in (("old", 4.5), ("new", 3.0)):
        row = summary[summary["signatures"] == signature_for(name)].iloc[0]
        assert row["dense_mean"] == pytest.approx(expected)


def test_a_different_dense_protocol_is_not_a_shared_reference(tmp_path):
    for name, seqlen in (("short", 64), ("long", 128)):
        path = write_record(tmp_path, signature_for(name), 0, labels_for("uniform", 0.5),
                            {PPL: setting_metrics(0.5, 0, 0.5)[PPL]},
                            {PPL: ppl_metric(np.full(WINDOWS, 1.0 + seqlen / 128), seqlen)})
        _with_model_key(path, "same")
    summary = tables.build_summary(records.records_to_frame(records.load_records([tmp_path])), [PPL])
    assert summary["is_dense"].sum() == 2
    short = summary[summary["signatures"] == signature_for("short")].iloc[0]
    assert short["dense_mean"] == pytest.approx(np.exp(1.5))


def test_an_overridden_model_path_is_not_labelled_as_the_preset(tmp_path):
    from hydra import compose, initialize_config_dir

    from prunelab.cli import CONF_DIR, build_setup, relabel_overridden_model

    overrides = [f"model.name_or_path={tmp_path}", "tracking=none"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    relabel_overridden_model(cfg, overrides)
    setup = build_setup(cfg)
    assert setup.model.display_name == tmp_path.name != "testbed_llama"
    kept = ["model.name_or_path=testbed_llama", "model.label=mine"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=kept)
    relabel_overridden_model(cfg, kept)
    assert build_setup(cfg).model.display_name == "mine"
