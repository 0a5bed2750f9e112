"""The massive-activation probe finds a planted outlier dimension and its ratio over the median."""

from __future__ import annotations

import torch

from prunelab.models import ModelSpec, load_model
from prunelab.probes.activations import profile, summary


def test_planted_massive_dimension_is_found(tiny_model_dirs):
    loaded = load_model(ModelSpec(name_or_path=str(tiny_model_dirs["llama"]), device="cpu"))
    samples = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))  # [N, T]
    plain = summary(profile(loaded.adapter, samples))
    with torch.no_grad():
        loaded.model.get_input_embeddings().weight[:, 5] = 1000.0  # every token writes 1000 to dim 5
    planted = profile(loaded.adapter, samples)
    assert len(planted) == loaded.adapter.num_layers + 1
    assert planted[0].top_dim == 5 and planted[0].max_abs == 1000.0
    assert summary(planted)["max_ratio"] > 100 * plain["max_ratio"]
    assert summary(planted)["top_dims"][0][0] == 5
