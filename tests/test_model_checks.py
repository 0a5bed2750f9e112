"""Issue 13, items 3 and 4: the model is checked before work, and user errors are one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_cli import compose_config, run_cli, tiny_run_overrides

from prunelab.cli import build_setup
from prunelab.errors import ConfigError, DataUnavailableError, ModelCheckError
from prunelab.models import ModelSpec, load_model
from prunelab.models import checks


def _copy(tiny_model_dirs, tmp_path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(tiny_model_dirs["llama"], target)
    return target


def _load(path: Path, **kwargs):
    return load_model(ModelSpec(name_or_path=str(path), device="cpu", **kwargs))


def test_a_config_without_num_hidden_layers_is_an_error_not_random_layers(tiny_model_dirs, tmp_path):
    model = _copy(tiny_model_dirs, tmp_path)
    config = json.loads((model / "config.json").read_text())
    del config["num_hidden_layers"]  # LlamaConfig's default (32) would add 28 random layers
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelCheckError, match="do not match its config: .*missing"):
        _load(model)


def test_unexpected_weights_are_an_error(tiny_model_dirs, tmp_path):
    model = _copy(tiny_model_dirs, tmp_path)
    tensors = load_file(model / "model.safetensors")
    tensors["model.layers.9.mlp.extra.weight"] = torch.zeros(2)
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelCheckError, match="unexpected"):
        _load(model)


def test_nan_weights_are_an_error(tiny_model_dirs, tmp_path):
    model = _copy(tiny_model_dirs, tmp_path)
    tensors = load_file(model / "model.safetensors")
    name = next(k for k in tensors if "down_proj" in k)
    tensors[name][0, 0] = float("nan")
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelCheckError, match="NaN or Inf"):
        _load(model)


def test_a_corrupted_safetensors_file_is_one_line(tiny_model_dirs, tmp_path):
    model = _copy(tiny_model_dirs, tmp_path)
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelCheckError, match="cannot load the model weights"):
        _load(model)


def test_a_model_larger_than_free_memory_is_refused(tiny_model_dirs, monkeypatch):
    monkeypatch.setattr(checks, "free_bytes", lambda device: 1000)
    with pytest.raises(ModelCheckError, match="needs about .* free"):
        _load(tiny_model_dirs["llama"])


def test_hub_model_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelCheckError, match="cannot load the model config from nobody/no-such-model"):
        load_model(ModelSpec(name_or_path="nobody/no-such-model", device="cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_is_one_line(tiny_model_dirs):
    with pytest.raises(ModelCheckError, match="no CUDA GPU"):
        load_model(ModelSpec(name_or_path=str(tiny_model_dirs["llama"]), device="cuda"))


@pytest.mark.parametrize("overrides,error,message", [
    (["runtime.threads=-1"], ConfigError, "runtime.threads"),
    (["seed=-3"], ConfigError, "seed=-3"),
    (["evaluation=ppl", "evaluation.perplexity.max_windows=0"], ConfigError, "max_windows"),
    (["model.tokenizer=/no/such/tokenizer"], ConfigError, "tokenizer path"),
])
def test_bad_settings_fail_before_any_model_loads(overrides, error, message):
    with pytest.raises(error, match=message):
        build_setup(compose_config(["model=llama2_7b", *overrides]))


@pytest.mark.parametrize("content,message", [(b"", "is empty"), (b"\x00\x01\x02binary", "binary")])
def test_empty_or_binary_text_files_fail_before_any_model_loads(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(DataUnavailableError, match=message):
        build_setup(compose_config(["data=local_text", f"data.calibration.paths=[{path}]",
                                    f"data.eval_paths=[{path}]"]))


def test_cli_one_line_for_a_calibration_seqlen_beyond_the_context(tiny_model_dirs, text_file, tmp_path):
    args = tiny_run_overrides(tiny_model_dirs["llama"], text_file, tmp_path) + [
        "data.calibration.seqlen=4096", "evaluation=ppl"]
    result = run_cli(args, tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "exceeds the model's context" in result.stderr.strip().splitlines()[-1]
    debug = run_cli(args + ["runtime.debug=true"], tmp_path)
    assert debug.returncode != 0 and "Traceback" in debug.stderr  # the debug switch


def test_hydra_override_errors_are_one_config_error_and_sweeps_are_left_to_hydra():
    from prunelab.cli import check_composes

    with pytest.raises(ConfigError, match="Could not override 'pruning.typo_key'"):
        check_composes(["pruning.typo_key=1"])
    check_composes(["pruning=magnitude,wanda", "sweep=seeds3"])  # a sweep: composed per job
