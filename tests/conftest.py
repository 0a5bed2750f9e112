"""Shared fixtures: tiny random models of every supported architecture, saved in HF format.

Every model goes through the same `from_pretrained` path as a hub model. A small byte-level BPE
tokenizer is trained on the fly, so nothing is downloaded.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from tiny import ARCHS, TEXT, make_tiny_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
if "PRUNELAB_CACHE" not in os.environ:  # a private cache per test session, removed at exit
    os.environ["PRUNELAB_CACHE"] = tempfile.mkdtemp(prefix="prunelab-cache-")
    atexit.register(shutil.rmtree, os.environ["PRUNELAB_CACHE"], True)
torch.set_num_threads(2)

@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_models")
    return {arch: make_tiny_model(arch, root / arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text(TEXT)
    return path


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> torch.device:
    """Each test that takes it runs on the CPU and, marked `gpu`, on CUDA: skipped (and reported
    as skipped, never passed) where there is no CUDA GPU. `make test-gpu` runs the CUDA half."""
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here")
    return torch.device(request.param)
