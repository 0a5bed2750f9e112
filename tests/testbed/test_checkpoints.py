"""Shipped testbed models load as standard Hugging Face models, give finite loss, fit limits."""

import math
from pathlib import Path

import pytest
import torch

from prunelab.testbed import corpus

CHECKPOINTS = Path(__file__).resolve().parents[2] / "src" / "prunelab" / "testbed" / "checkpoints"
MODEL_DIRS = sorted(
    [CHECKPOINTS / "testbed_llama"] + list((CHECKPOINTS / "testbed_pythia").glob("step*")),
    key=str,
)
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _megabytes(path: Path) -> float:
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files) / 2**20


def _existing(directory: Path) -> Path:
    if not (directory / "model.safetensors").exists():
        pytest.skip(f"{directory} not trained yet")
    return directory


@pytest.mark.parametrize("directory", MODEL_DIRS, ids=lambda d: f"{d.parent.name}/{d.name}")
def test_model_loads_and_gives_finite_loss(directory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = _existing(directory)
    for name in REQUIRED_FILES:
        assert (directory / name).exists(), name
    assert _megabytes(directory) <= 15
    model = AutoModelForCausalLM.from_pretrained(str(directory))
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    assert next(model.parameters()).dtype == torch.float32
    ids = tokenizer(corpus.documents("test", 1)[0], return_tensors="pt")["input_ids"][:, :128]
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
    assert math.isfinite(loss)


def test_llama_architecture():
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(_existing(CHECKPOINTS / "testbed_llama")))
    assert config.model_type == "llama"
    assert config.num_hidden_layers >= 16
    assert config.num_key_value_heads < config.num_attention_heads
    assert (CHECKPOINTS / "testbed_llama" / "README.md").exists()


def test_pythia_series():
    from transformers import AutoConfig

    root = CHECKPOINTS / "testbed_pythia"
    steps = sorted(int(d.name[4:]) for d in root.glob("step*"))
    if not steps:
        pytest.skip("testbed_pythia not trained yet")
    assert len(steps) >= 5 and steps[0] == 0
    config = AutoConfig.from_pretrained(str(root / f"step{steps[-1]}"))
    assert config.model_type == "gpt_neox" and config.use_parallel_residual
    assert config.num_hidden_layers >= 12
    assert (root / "README.md").exists()


def test_total_checkpoint_size():
    assert _megabytes(CHECKPOINTS) <= 100
