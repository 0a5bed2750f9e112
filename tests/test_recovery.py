"""Training-free recovery after depth pruning: Ghosted, LinearPatch, ReplaceMe; save and reload."""

from __future__ import annotations

import math

import pytest
import torch
from tiny import ARCHS, VOCAB
from torch import nn
from transformers import AutoModelForCausalLM

from prunelab.context import PruneContext, PruneReport
from prunelab.errors import ConfigError
from prunelab.models import ModelSpec, load_model
from prunelab.models.boundary_operators import apply_saved_boundary_operators, save_recovered
from prunelab.pruning.report import parameter_counts
from prunelab.recovery.base import RecoveryContext
from prunelab.recovery.boundary import contiguous_blocks, site_of
from prunelab.recovery.ghosted import Ghosted, operator_boundaries
from prunelab.recovery.hadamard import dct_basis, hadamard_matrix, rotation
from prunelab.recovery.linear_patch import AbsMeans, LinearPatch, linear_patch_matrix, linear_patch_scale
from prunelab.recovery.replaceme import ReplaceMe, ReplaceMeCosine, fit_cosine_transform

C = 32  # tiny models' hidden size


def samples(n: int = 8, t: int = 16) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, t), generator=torch.Generator().manual_seed(7))


def load(dirs, arch: str = "llama"):
    return load_model(ModelSpec(name_or_path=str(dirs[arch]), device="cpu"))


def logits(model, tokens=None):
    with torch.no_grad():
        return model(input_ids=samples() if tokens is None else tokens, use_cache=False).logits


def pruned_context(loaded, removed: list[int], tokens=None) -> RecoveryContext:
    tokens = samples() if tokens is None else tokens
    dense = list(loaded.adapter.layers)
    loaded.adapter.remove_layers(removed)
    ctx = PruneContext(loaded, 0, lambda: tokens, batch_size=4, progress=False)
    return RecoveryContext(ctx, PruneReport(removed_layers=removed, dense_layers=dense))


class LinearLayer(nn.Module):
    """A decoder layer whose output is exactly its input times A."""

    def __init__(self, a: torch.Tensor):
        super().__init__()
        self.a = nn.Parameter(a, requires_grad=False)

    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states @ self.a  # [B, T, C]


# --- Hadamard ------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [12, 20, 28, 32, 64, 96, 768, 896])
def test_hadamard_matrices_are_orthogonal(n):
    h = hadamard_matrix(n)  # 32: tiny models, 64: testbed; 12/20/28 the Paley cores of 3072/5120/3584
    assert h is not None and set(h.unique().tolist()) == {-1.0, 1.0}
    torch.testing.assert_close(h @ h.T, n * torch.eye(n, dtype=torch.float64))


def test_sizes_without_a_hadamard_fall_back_to_an_orthonormal_dct():
    q, kind = rotation(10)
    assert kind == "dct" and hadamard_matrix(10) is None
    torch.testing.assert_close(q @ q.T, torch.eye(10, dtype=torch.float64))
    torch.testing.assert_close(dct_basis(52) @ dct_basis(52).T, torch.eye(52, dtype=torch.float64))


# --- Ghosted ---------------------------------------------------------------------------------------
def test_boundary_sites_skip_removed_layers():
    assert site_of(2, [1], 4) == 1  # surviving layer 2 is layer 1 of the pruned model
    assert site_of(1, [0, 1, 3], 4) == site_of(2, [0, 1, 3], 4) == 0  # chained at layer 2's input
    assert site_of(4, [3], 4) == site_of(3, [2, 3], 4) == "final_norm"


def test_ghosted_operator_is_the_least_squares_map(tiny_model_dirs):
    loaded = load(tiny_model_dirs)
    with torch.no_grad():
        hs = loaded.model(input_ids=samples(), output_hidden_states=True, use_cache=False).hidden_states
    x_pre, x_post = hs[1].reshape(-1, C).double(), hs[3].reshape(-1, C).double()  # block [1, 3)
    expected = torch.linalg.lstsq(x_pre, x_post).solution  # [C, C]
    boundaries, [w], used = Ghosted(nsamples=32).fit(pruned_context(loaded, [1, 2]))
    assert boundaries == [(1, 3)] and used == 8
    torch.testing.assert_close(w, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("removed", [[1, 2], [0], [3], [1, 3], [0, 1, 3]])
def test_an_exactly_linear_block_is_recovered_by_ghosted_and_not_by_linear_patch(tiny_model_dirs, removed):
    """[0]: operator on the embeddings' output; [3]: before the final norm; [1, 3]: one per layer;
    [0, 1, 3]: adjacent layers inside a non-contiguous removal, two operators chained at one site."""
    results = {}
    for recovery in (Ghosted(), LinearPatch(rotate=False), LinearPatch(rotate=True)):
        loaded = load(tiny_model_dirs)
        g = torch.Generator().manual_seed(0)
        for i in removed:
            a = torch.eye(C) + 0.3 * torch.randn(C, C, generator=g) / math.sqrt(C)  # [C, C]
            loaded.adapter.layers[i] = LinearLayer(a)
        dense = logits(loaded.model)
        ctx = pruned_context(loaded, removed)
        details = recovery.recover(ctx)
        expected_operators = (operator_boundaries(removed, "auto") if recovery.name == "ghosted"
                              else contiguous_blocks(removed))
        assert len(details["operators"]) == len(expected_operators)
        results[recovery.name] = (logits(loaded.model) - dense).abs().max().item()
    assert results["ghosted"] < 1e-3
    assert results["linear_patch_d"] > 20 * results["ghosted"] + 1e-2
    assert results["linear_patch_r"] > 20 * results["ghosted"] + 1e-2


# --- LinearPatch -----------------------------------------------------------------------------------
def test_linear_patch_scale_by_hand():
    x_pre = torch.tensor([[1.0, -2.0], [3.0, 0.0]])  # mean |.| per channel: 2, 1
    x_post = torch.tensor([[-4.0, 1.0], [2.0, 2.0]])  # 3, 1.5
    stats = AbsMeans(None)
    stats.update(x_pre[None], x_post[None])
    expected = torch.tensor([1.5, 1.5], dtype=torch.float64)
    torch.testing.assert_close(linear_patch_scale(stats.pre, stats.post), expected)
    q, _ = rotation(2)  # rotated basis: mean |X Q| per channel
    rotated = AbsMeans(q)
    rotated.update(x_pre[None], x_post[None])
    zp, zq = (x_pre.double() @ q).abs().mean(0), (x_post.double() @ q).abs().mean(0)
    c = linear_patch_scale(rotated.pre, rotated.post)
    torch.testing.assert_close(c, zq / zp)
    torch.testing.assert_close(linear_patch_matrix(c, q), q @ torch.diag(c) @ q.T)


def test_linear_patch_reference_scale_quirk_averages_batch_ratios_over_128():
    stats = AbsMeans(None)
    stats.update(torch.ones(1, 2, 1), 2 * torch.ones(1, 2, 1))  # batch ratio 2
    stats.update(torch.ones(1, 2, 1), 6 * torch.ones(1, 2, 1))  # batch ratio 6
    assert linear_patch_scale(stats.pre, stats.post).item() == pytest.approx(4.0)  # pooled means
    assert (stats.ratio_sum / 128).item() == pytest.approx(8 / 128)  # the reference's number


# --- ReplaceMe -------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])  # gpt_neox: the MLP output projection has a bias
def test_replaceme_merged_model_equals_the_hooked_one(tiny_model_dirs, arch):
    merged, hooked = load(tiny_model_dirs, arch), load(tiny_model_dirs, arch)
    details = ReplaceMe().recover(pruned_context(merged, [2, 3]))
    assert details["merged"][0]["merged_into_layer"] == 1 and details["added_parameters"] == 0
    _, [t] = ReplaceMe().fit(pruned_context(hooked, [2, 3]))
    before = logits(hooked.model)
    writer = hooked.adapter.residual_writers(hooked.adapter.layers[1])[1]
    writer.register_forward_hook(lambda _m, _a, out: (out.double() @ t).to(out.dtype))
    after = logits(hooked.model)
    assert (after - before).abs().max() > 1e-3  # the transform does something
    torch.testing.assert_close(logits(merged.model), after, atol=1e-4, rtol=1e-4)


def test_replaceme_lstsq_solves_for_the_mlp_output(tiny_model_dirs):
    loaded = load(tiny_model_dirs)
    seen = []
    writer = loaded.adapter.residual_writers(loaded.adapter.layers[1])[1]
    handle = writer.register_forward_hook(lambda _m, _a, out: seen.append(out.detach()))
    with torch.no_grad():
        hs = loaded.model(input_ids=samples(), output_hidden_states=True, use_cache=False).hidden_states
    handle.remove()
    m = seen[0].reshape(-1, C).double()  # MLP output of layer s - 1 = 1
    target = hs[3].reshape(-1, C).double() - (hs[2].reshape(-1, C).double() - m)  # X_post - Y
    expected = torch.linalg.lstsq(m, target).solution
    _, [t] = ReplaceMe().fit(pruned_context(loaded, [2]))
    torch.testing.assert_close(t, expected, atol=1e-5, rtol=1e-4)


def test_replaceme_cosine_starts_at_identity_and_lowers_the_loss():
    g = torch.Generator().manual_seed(0)
    m = torch.randn(512, 8, generator=g)
    target = m @ (torch.eye(8) + 0.5 * torch.randn(8, 8, generator=g))

    def loss(t):
        return (1 - torch.nn.functional.cosine_similarity(m @ t.float(), target, dim=-1)).mean().item()

    t = fit_cosine_transform(m, target, lr=1e-2, epochs=5, batch_tokens=128)
    assert loss(t) < 0.5 * loss(torch.eye(8))
    torch.testing.assert_close(fit_cosine_transform(m, target, epochs=1, lr=1e-30).float(), torch.eye(8))


def test_recoveries_refuse_what_they_cannot_repair(tiny_model_dirs):
    loaded = load(tiny_model_dirs)
    with pytest.raises(ConfigError, match="layer 0"):
        ReplaceMe().recover(pruned_context(loaded, [0, 1]))
    weight_pruned = PruneReport(layer_targets=[0.5] * 4)
    ctx = RecoveryContext(PruneContext(loaded, 0, samples, progress=False), weight_pruned)
    with pytest.raises(ConfigError, match="pruning=depth"):
        Ghosted().recover(ctx)
    with pytest.raises(ConfigError, match="operators"):
        Ghosted(operators="sometimes")


# --- save and reload -------------------------------------------------------------------------------
@pytest.mark.parametrize("arch,recovery,removed", [
    *[(arch, "ghosted", [0, 3]) for arch in ARCHS],  # embeddings' output and before the final norm
    ("llama", "linear_patch_r", [1, 2]), ("opt", "linear_patch_d", [2, 3]),
    ("qwen3", "replaceme", [2]), ("opt", "replaceme_cosine", [1, 2]),
])
def test_recovered_model_saves_and_reloads_with_identical_logits(tiny_model_dirs, tmp_path, arch, recovery,
                                                                removed):
    make = {"ghosted": Ghosted, "linear_patch_r": lambda: LinearPatch(rotate=True),
            "linear_patch_d": LinearPatch, "replaceme": ReplaceMe, "replaceme_cosine": ReplaceMeCosine}
    loaded = load(tiny_model_dirs, arch)
    ctx = pruned_context(loaded, removed)
    unrecovered = logits(loaded.model)
    details = make[recovery]().recover(ctx)
    expected = logits(loaded.model)
    assert (expected - unrecovered).abs().max() > 1e-4
    save_recovered(loaded.model, tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert reloaded.config.num_hidden_layers == 4 - len(removed)
    attached = apply_saved_boundary_operators(reloaded, tmp_path)
    assert attached == len(details.get("operators", []))
    torch.testing.assert_close(logits(reloaded), expected)
    total = parameter_counts(loaded.adapter)["total"]
    assert sum(p.numel() for p in reloaded.parameters()) == total  # operators counted once, both sides
