"""The Python API: prunelab.prune / evaluate / run on in-memory tiny models, against the CLI's path."""

from __future__ import annotations

import copy

import pytest
import torch
from test_cli import tiny_run_overrides
from tiny import TEXT, VOCAB
from transformers import AutoModelForCausalLM, AutoTokenizer

import prunelab
from prunelab.context import PruneContext
from prunelab.errors import ConfigError
from prunelab.models import ModelSpec, load_model
from prunelab.pruning.wanda import Wanda


@pytest.fixture
def llama(tiny_model_dirs):
    path = tiny_model_dirs["llama"]
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def zeros(model) -> dict[str, torch.Tensor]:
    return {n: p.detach() == 0 for n, p in model.named_parameters() if n.endswith("proj.weight")}


def test_prune_in_memory_model_equals_the_pipelines_method(llama, tiny_model_dirs):
    model, tokenizer = llama
    ids = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(0))
    report = prunelab.prune(model, tokenizer, method="wanda", sparsity=0.5, calibration=ids, progress=False)
    assert report["labels"]["method"] == "wanda" and abs(report["sparsity"]["overall"] - 0.5) < 1e-9
    assert report["parameters"]["pruned"]["nonzero"] < report["parameters"]["dense"]["nonzero"]
    # the same method through the pipeline's objects (what a CLI run builds) gives the same masks
    loaded = load_model(ModelSpec(name_or_path=str(tiny_model_dirs["llama"]), device="cpu"))
    method = Wanda(sparsity=0.5)
    method.prune(PruneContext(loaded, 0, lambda: ids, progress=False),
                 method.allocate(PruneContext(loaded, 0, lambda: ids, progress=False)))
    mine, theirs = zeros(model), zeros(loaded.model)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_prune_accepts_texts_and_method_options(llama):
    model, tokenizer = llama
    report = prunelab.prune(model, tokenizer, method="sparsegpt", sparsity=0.5, sparsity_type="2:4",
                            calibration=[TEXT], nsamples=4, seqlen=16, progress=False)
    assert report["labels"]["sparsity_type"] == "2:4"
    for name, mask in zeros(model).items():
        assert (mask.view(mask.shape[0], -1, 4).sum(-1) >= 2).all(), name


def test_depth_pruning_with_a_scorer_and_a_recovery(llama):
    model, tokenizer = llama
    layers = model.config.num_hidden_layers
    ids = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(1))
    report = prunelab.prune(model, tokenizer, method="depth", scorer="angular", num_layers=1,
                            recovery="ghosted", calibration=ids, progress=False)
    assert len(report["pruning"]["removed_layers"]) == 1
    assert model.config.num_hidden_layers == layers - 1 and report["labels"]["recovery"] == "ghosted"
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()


def test_bad_settings_are_one_line_errors_with_close_names(llama):
    model, tokenizer = llama
    with pytest.raises(ConfigError, match="did you mean sparsity_type"):
        prunelab.prune(model, tokenizer, method="wanda", sparsty_type="2:4", calibration="testbed")
    with pytest.raises(ConfigError, match="did you mean wanda"):
        prunelab.prune(model, tokenizer, method="wandaa")
    with pytest.raises(ConfigError, match="needs calibration data"):
        prunelab.prune(copy.deepcopy(model), tokenizer, method="wanda", progress=False)
    report = prunelab.prune(model, tokenizer, method="magnitude", sparsity=0.3, progress=False)  # data-free
    assert abs(report["sparsity"]["overall"] - 0.3) < 0.01


def test_run_and_evaluate_give_the_cli_records_metrics(tiny_model_dirs, text_file, tmp_path):
    overrides = tiny_run_overrides(tiny_model_dirs["llama"], text_file, tmp_path)
    record = prunelab.run(overrides)
    assert record["status"] == "completed" and record["environment"]["package"]["version"]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])
    evaluation = [o for o in overrides if o.startswith(("evaluation.", "data."))]
    metrics = prunelab.evaluate(model, tokenizer, data="local_text", overrides=evaluation, progress=False)
    dense = record["metrics"]["dense"]
    assert metrics.keys() == dense.keys()
    for key, metric in metrics.items():
        assert metric["protocol"] == dense[key]["protocol"], key
        assert metric["value"] == pytest.approx(dense[key]["value"], rel=1e-6), key


def test_the_readme_snippet_runs_as_written(monkeypatch, tmp_path):
    """The README's Python snippet (between its readme-snippet markers), executed as a user would."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    [snippet] = re.findall(r"<!-- readme-snippet -->\n```python\n(.*?)```\n<!-- /readme-snippet -->", readme, re.S)
    monkeypatch.chdir(tmp_path)
    printed: list[str] = []
    exec(compile(snippet, "README.md", "exec"), {"print": lambda *a: printed.append(" ".join(map(str, a)))})
    [line] = printed
    assert line.startswith("sparsity 0.500, perplexity ")


# --- prunelab.load ---------------------------------------------------------------------------------
def test_load_takes_a_model_option_a_folder_and_a_pruned_checkpoint(tiny_model_dirs, tmp_path):
    from functools import partial

    from prunelab.models.boundary_operators import save_recovered
    from prunelab.recovery.plain_loading import save_for_plain_loading
    from prunelab.tracking.saved_model import save_model_folder

    model, tokenizer = prunelab.load("testbed_llama", device="cpu")
    assert model.config.model_type == "llama" and tokenizer("a b").input_ids
    model, tokenizer = prunelab.load(tiny_model_dirs["llama"])
    dense_layers = model.config.num_hidden_layers
    prunelab.prune(model, tokenizer, method="depth", scorer="block_influence", num_layers=2,
                   recovery="ghosted", calibration=[TEXT * 4], nsamples=2, seqlen=16, progress=False)
    ids = torch.tensor([[1, 5, 9, 3, 7, 2]])
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    folder = save_model_folder(model, tokenizer, tmp_path / "model",
                               partial(save_for_plain_loading, save=save_recovered))
    reloaded, _ = prunelab.load(str(folder))
    assert reloaded.config.num_hidden_layers == dense_layers - 2
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, expected)  # Ghosted's operators came back
    with pytest.raises(ConfigError, match="does not exist"):
        prunelab.load("./no/such/folder")
    with pytest.raises(ConfigError, match="prunelab.load takes"):
        prunelab.load(None)


def test_load_reads_the_packaged_smollm2_option_from_python():
    """`smollm2_135m` is a GGUF inside a registry package: `prunelab.load` converts it (once, into
    the cache) as a run does, where `from_pretrained` alone cannot read it."""
    from oracles.compare import SMOLLM2_CACHE  # converted once, shared with the faithful-mask tests

    model, tokenizer = prunelab.load("smollm2_135m", device="cpu", cache_dir=SMOLLM2_CACHE)
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (30, 576)
    ids = tokenizer("To be, or not to be", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits  # [1, T, vocab]
    assert logits.shape[-1] == model.config.vocab_size and torch.isfinite(logits).all()
    assert tokenizer.decode(logits[0, :-1].argmax(-1)).strip()  # a real model predicts words


def test_a_width_pruned_checkpoint_reloads_in_one_call_with_the_same_logits(tiny_model_dirs, tmp_path):
    """FLAP cuts heads and channels per layer (and adds its compensation biases): the saved config
    has the dense shapes plus `prunelab_layer_shapes`, which `from_pretrained` alone cannot load."""
    from functools import partial

    from transformers import AutoModelForCausalLM as Auto

    from prunelab.models.boundary_operators import save_recovered
    from prunelab.recovery.plain_loading import save_for_plain_loading
    from prunelab.tracking.saved_model import save_model_folder

    model, tokenizer = prunelab.load(tiny_model_dirs["llama"])
    dense = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(0))  # [N, T]
    prunelab.prune(model, tokenizer, method="flap", calibration=ids, progress=False)
    pruned = sum(p.numel() for p in model.parameters())
    assert pruned < dense
    with torch.no_grad():
        expected = model(input_ids=ids[:1]).logits  # [1, T, V]
    folder = save_model_folder(model, tokenizer, tmp_path / "model", partial(save_for_plain_loading, save=save_recovered))
    with pytest.raises(Exception):  # noqa: B017  (the plain call fails on the cut shapes)
        Auto.from_pretrained(folder)
    reloaded, _ = prunelab.load(str(folder))
    assert sum(p.numel() for p in reloaded.parameters()) == pruned
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids[:1]).logits, expected)
        reloaded.generate(ids[:1, :4], max_new_tokens=3, do_sample=False)  # the KV cache works
