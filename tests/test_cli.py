"""The `prunelab` command: every config composes, bad input is one line, a run leaves a full record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from prunelab.cli import build_setup, check_composes, check_overrides, group_options, model_preset
from prunelab.config import compose_config
from prunelab.errors import ConfigError
from prunelab.pruning.base import first_stage

GROUPS = ["model", "data", "pruning", "pruning/allocation", "recovery", "evaluation", "tracking", "arm", "sparsity"]


def tiny_run_overrides(model_dir: Path, text: Path, tmp: Path) -> list[str]:
    return [f"model.name_or_path={model_dir}", "model.device=cpu", "data=local_text",
            f"data.calibration.paths=[{text}]", f"data.eval_paths=[{text}]",
            "data.calibration.nsamples=4", "data.calibration.seqlen=16",
            "evaluation.perplexity.seqlen=32", "tracking=none", "runtime.progress=false",
            f"paths.records_dir={tmp / 'records'}", f"paths.cache_dir={tmp / 'cache'}"]


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in group_options(g)])
def test_every_group_option_composes_and_builds(group, option, text_file, tmp_path):
    overrides = [f"{group}={option}", f"paths.records_dir={tmp_path}"]
    if group == "data" and option == "local_text":
        overrides += [f"data.calibration.paths=[{text_file}]", f"data.eval_paths=[{text_file}]"]
    if group == "recovery" and option != "none":
        overrides.append("pruning=depth")  # these recoveries repair removed layers
    setup = build_setup(compose_config(overrides))
    assert setup.signature and setup.record_file.name == "result.json"
    stage, _ = first_stage(setup.pruning)  # named for its work: depth and width pruning score, the rest allocate
    assert stage == ("score" if getattr(setup.pruning, "changes_shapes", False) else "allocate")


@pytest.mark.parametrize("experiment", group_options("experiment"))
def test_every_experiment_composes_and_builds(experiment, tmp_path):
    """A study preset composes with its own model, data and evaluation (its first sweep point)."""
    setup = build_setup(compose_config([f"experiment={experiment}", f"paths.records_dir={tmp_path}"]))
    assert setup.study and setup.record_file.name == "result.json"
    if experiment.endswith(("_smollm2", "_qwen25", "_gemma3")):  # the real backbones' studies
        assert setup.model.gguf_file and setup.data.calibration.source == "realtext"


def test_model_preset_by_name_for_scripts():
    spec = model_preset("smollm2_135m", device="cpu")
    assert spec.gguf_file and spec.device == "cpu" and spec.label == "smollm2_135m"
    with pytest.raises(ConfigError, match="did you mean smollm2_135m"):
        model_preset("smolm2_135m")


def test_real_text_brings_its_protocol_unless_one_is_chosen():
    """`data=realtext` alone selects the real-text protocol (not the testbed's tasks and all windows);
    an explicit `evaluation=` still wins."""
    chosen = compose_config(["model=smollm2_135m", "data=realtext", "pruning=wanda"])
    assert chosen.evaluation == compose_config(["evaluation=realtext"]).evaluation
    assert compose_config(["data=realtext", "evaluation=ppl"]).evaluation.zeroshot is None
    assert compose_config([]).evaluation == compose_config(["evaluation=default"]).evaluation


@pytest.mark.parametrize("overrides,message", [
    (["pruning=magnitde"], "did you mean magnitude"),
    (["model=lama2_7b"], "did you mean llama2_7b"),
    (["pruning/allocation=unifrom"], "did you mean uniform"),
])
def test_unknown_group_options_suggest_close_names(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_overrides(overrides)


@pytest.mark.parametrize("overrides,message", [
    (["pruning.sparsty=0.6"], "did you mean pruning.sparsity"),
    (["pruning=sparsegpt", "pruning.percdmp=0.1"], "did you mean pruning.percdamp"),
    (["runtime.thread=1"], "did you mean runtime.threads"),
])
def test_misspelled_keys_suggest_the_keys_of_their_node(overrides, message):
    from prunelab.config import check_composes

    with pytest.raises(ConfigError, match=message):
        check_composes(overrides)


@pytest.mark.parametrize("overrides,message", [
    (["pruning.sparsity_type=2:4", "pruning.sparsity=0.6"], "2:4 prunes 2/4"),
    (["pruning.sparsity=1.0"], "outside"),
    (["model.name_or_path=/no/such/model"], "does not exist"),
    (["pruning.group=column"], "pruning.group"),
    (["+pruning.typo_key=1"], "typo_key"),
])
def test_bad_values_fail_before_any_model_loads(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_setup(compose_config(["model=llama2_7b", *overrides]))


def run_cli(args: list[str], tmp: Path, module: str = "prunelab.cli") -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", module, *args, f"hydra.run.dir={tmp / 'out'}"],
                          capture_output=True, text=True, env=env, cwd=tmp, timeout=300)


@pytest.mark.parametrize("module", ["prunelab.cli", "prunelab"])  # `python -m prunelab` too
def test_cli_prints_one_line_for_bad_input(tmp_path, module):
    result = run_cli(["pruning=wandaa"], tmp_path, module)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "unknown pruning option 'wandaa'" in result.stderr


def test_a_setting_of_the_methods_an_arm_sweep_chooses_is_one_line_naming_double_plus(tmp_path):
    """`pruning.params_removed` is not in the default method's config (Wanda), which a sweep's runs
    start from: Hydra's own advice (`+`) fails in every run whose method has the key."""
    result = run_cli(["-m", "arm=flap,depth_sleb", "pruning.params_removed=0.2"], tmp_path)
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0, result.stderr
    assert "write ++pruning.params_removed=0.2" in result.stderr and "(arm)" in result.stderr
    result = run_cli(["experiment=width_vs_depth", "pruning.params_removed=0.2"], tmp_path)  # its sweep: arm
    assert result.returncode == 2 and "write ++pruning.params_removed=0.2" in result.stderr, result.stderr
    check_composes(["-m", "arm=flap,depth_sleb", "++pruning.params_removed=0.2"])
    for arm, target in (("flap", "prunelab.pruning.flap.FLAP"), ("depth_sleb", "prunelab.pruning.depth.DepthPruning")):
        cfg = compose_config([f"arm={arm}", "++pruning.params_removed=0.2"])  # what each run composes
        assert cfg.pruning._target_ == target and cfg.pruning.params_removed == 0.2
    with pytest.raises(ConfigError, match="unknown pruning option"):  # a sweep's fixed part is still checked
        check_composes(["-m", "seed=0,1", "pruning=wandaa"])


def test_cli_run_writes_a_complete_record_and_resumes(tiny_model_dirs, text_file, tmp_path):
    args = tiny_run_overrides(tiny_model_dirs["llama"], text_file, tmp_path) + ["save_model=true"]
    result = run_cli(args, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    [path] = list((tmp_path / "records").glob("*/seed0/result.json"))
    record = json.loads(path.read_text())
    assert record["status"] == "completed"
    for field in ("signature", "seed", "config", "environment", "labels", "timings", "peak_memory",
                  "parameters", "sparsity", "metrics"):
        assert record[field] is not None, field
    assert {"git_sha", "git_dirty", "libraries", "hardware"} <= record["environment"].keys()
    hardware = record["environment"]["hardware"]
    assert hardware["cpu_model"]
    assert hardware["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    stages = {"load", "dense_eval", "allocate", "prune", "recover", "evaluate", "total"}
    assert stages <= record["timings"].keys()
    assert "score" not in record["timings"]  # weight pruning allocates; only depth pruning scores
    dense = record["metrics"]["dense"]["ppl/local_text/token"]
    pruned = record["metrics"]["pruned"]["ppl/local_text/token"]
    assert dense["protocol"] == pruned["protocol"] and dense["protocol"]["seqlen"] == 32
    assert len(pruned["samples"]["values"]) == pruned["protocol"]["windows"]
    assert abs(record["sparsity"]["overall"] - 0.5) < 1e-3
    assert (tmp_path / "out" / "result.json").exists()

    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(record["saved_model"])
    zeros = sum(int((m.weight == 0).sum()) for n, m in saved.named_modules() if n.endswith("down_proj"))
    assert zeros > 0

    again = run_cli(args, tmp_path)
    assert again.returncode == 0 and "already completed" in again.stdout + again.stderr
    assert json.loads(path.read_text())["finished_at"] == record["finished_at"]


def test_a_failed_run_records_the_stage_and_error(tiny_model_dirs, text_file, tmp_path, monkeypatch):
    from prunelab import pipeline

    cfg = compose_config(tiny_run_overrides(tiny_model_dirs["llama"], text_file, tmp_path))
    setup = build_setup(cfg)

    def explode(self, ctx, scores):
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(type(setup.pruning), "prune", explode)
    with pytest.raises(RuntimeError):
        pipeline.run(setup)
    record = json.loads(setup.record_file.read_text())
    assert record["status"] == "failed"
    assert record["failure"]["stage"] == "prune" and "simulated" in record["failure"]["message"]


def test_wandb_without_credentials_logs_offline_and_keeps_the_record(tiny_model_dirs, text_file, tmp_path,
                                                                     monkeypatch):
    from prunelab import pipeline

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    overrides = tiny_run_overrides(tiny_model_dirs["llama"], text_file, tmp_path)
    overrides = [o for o in overrides if o != "tracking=none"] + ["tracking=wandb", f"tracking.dir={tmp_path}"]
    setup = build_setup(compose_config(overrides + ["pruning=dense"]))
    record = pipeline.run(setup)
    assert record["status"] == "completed"
    assert list((tmp_path / "wandb").glob("offline-run-*"))
    assert setup.tracker.run is None  # finished


def test_a_failed_run_does_not_stop_the_sweep(tiny_model_dirs, text_file, tmp_path):
    """The tiny model has 4 layers: removing 9 fails at run time; removing 1 still runs and the
    command exits 1 naming the failed job."""
    args = ["-m", *tiny_run_overrides(tiny_model_dirs["llama"], text_file, tmp_path),
            "pruning=depth", "pruning.num_layers=9,1", "evaluation=ppl"]
    result = run_cli(args, tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "1 run(s) of the sweep failed" in result.stderr and "pruning.num_layers=9" in result.stderr
    statuses = sorted(json.loads(p.read_text())["status"]
                      for p in (tmp_path / "records").glob("*/seed0/result.json"))
    assert statuses == ["completed", "failed"]


def test_a_key_added_later_keeps_old_signatures_at_its_neutral_value():
    """Depth configs gained `pruning.params_removed` (null: count layers); a run at null keeps the
    signature of the records written before the key existed, a set value makes its own."""
    from prunelab.config import resolved
    from prunelab.tracking.record import config_signature

    config = resolved(compose_config(["pruning=depth", "pruning.num_layers=2"]))
    assert config["pruning"]["params_removed"] is None
    before = {**config, "pruning": {k: v for k, v in config["pruning"].items() if k != "params_removed"}}
    assert config_signature(config) == config_signature(before)
    budget = {**config, "pruning": {**config["pruning"], "params_removed": 0.2}}
    assert config_signature(budget) != config_signature(config)


def test_the_lm_eval_zeroshot_scorer_keeps_the_signature_of_records_written_before_the_key():
    """`evaluation.zeroshot.scorer` came later: lm_eval (what scored before) is neutral, the shared
    prefix scorer is a setting of its own."""
    from prunelab.config import resolved
    from prunelab.tracking.record import config_signature

    config = resolved(compose_config(["evaluation=realtext"]))
    zeroshot = config["evaluation"]["zeroshot"]
    assert zeroshot["scorer"] == "lm_eval"
    before = {**config, "evaluation": {**config["evaluation"],
                                       "zeroshot": {k: v for k, v in zeroshot.items() if k != "scorer"}}}
    assert config_signature(config) == config_signature(before)
    shared = {**config, "evaluation": {**config["evaluation"], "zeroshot": {**zeroshot, "scorer": "shared_context"}}}
    assert config_signature(shared) != config_signature(config)
    no_zeroshot = {**config, "evaluation": {**config["evaluation"], "zeroshot": None}}
    assert config_signature(no_zeroshot) != config_signature(config)


def test_signature_ignores_seed_and_paths_but_not_settings(tmp_path):
    base = build_setup(compose_config(["model=llama2_7b", "seed=0"]))
    other_seed = build_setup(compose_config(["model=llama2_7b", "seed=5", f"paths.records_dir={tmp_path}"]))
    other_ratio = build_setup(compose_config(["model=llama2_7b", "pruning.sparsity=0.6"]))
    assert base.signature == other_seed.signature != other_ratio.signature
    torch.manual_seed(0)
