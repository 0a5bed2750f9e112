"""SparseGPT: the solver against an explicit OBS computation, the Hessian statistic, the method on tiny
models."""

from __future__ import annotations

import pytest
import torch
from tiny import VOCAB, assert_nm_pattern

import prunelab.pruning  # noqa: F401  first: importing prunelab.allocation first hits an import cycle
from prunelab.calibration.statistics import Hessian
from prunelab.context import PruneContext
from prunelab.errors import ConfigError
from prunelab.models import ModelSpec, load_model
from prunelab.pruning.sparsegpt import SparseGPT
from prunelab.pruning.sparsegpt_solver import inverse_hessian_factor, solve_with_factor, sparsegpt_solve
from prunelab.pruning.wanda import Wanda


def problem(rows=6, cols=8, tokens=64, seed=0):
    """Weights and correlated inputs X [tokens, cols] of one linear layer."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(cols, cols, generator=g) + 2 * torch.eye(cols)
    x = torch.randn(tokens, cols, generator=g) @ mix  # [tokens, cols]
    return torch.randn(rows, cols, generator=g), x


def damped(h: torch.Tensor, percdamp=0.01) -> torch.Tensor:
    return h + percdamp * h.diag().mean() * torch.eye(h.shape[0], dtype=h.dtype)


def explicit_obs(w, h, sparsity=None, nm=None):
    """One column at a time in float64: Hq = inverse of the damped H over columns q.. (not yet visited);
    each pruned w_q moves onto the rest of its row by -w_q / Hq[0, 0] * Hq[0, :]. Mask: the reference
    rule (unstructured: lowest w^2 / Hq[0, 0] over the whole matrix at the start, one block; N:M: the
    n lowest of each m-column group of the already-updated weights)."""
    w, h = w.double().clone(), damped(h.double())
    rows, cols = w.shape
    inverses = [torch.linalg.inv(h[q:, q:]) for q in range(cols)]
    d = torch.tensor([inverses[q][0, 0] for q in range(cols)], dtype=torch.float64)
    mask = torch.zeros(rows, cols, dtype=torch.bool)
    if nm is None:
        scores = (w**2 / d).flatten()
        mask.view(-1)[torch.sort(scores, stable=True).indices[: int(scores.numel() * sparsity)]] = True
    for q in range(cols):
        if nm is not None and q % nm[1] == 0:
            scores = w[:, q : q + nm[1]] ** 2 / d[q : q + nm[1]]
            lowest = torch.topk(scores, nm[0], dim=1, largest=False).indices
            mask[:, q : q + nm[1]].scatter_(1, lowest, True)
        for r in torch.nonzero(mask[:, q]).flatten():
            w[r, q:] -= w[r, q] / inverses[q][0, 0] * inverses[q][0, :]
    return w, mask


def test_solver_equals_explicit_obs_unstructured():
    w, x = problem()
    h = 2 * x.T @ x / 1  # one sample: H = (2/n) X^T X
    pruned, mask = sparsegpt_solve(w, h, 0.5, blocksize=128)
    expected, expected_mask = explicit_obs(w, h, sparsity=0.5)
    assert torch.equal(mask, expected_mask)
    assert int(mask.sum()) == 24
    assert bool((pruned[mask] == 0).all())
    torch.testing.assert_close(pruned.double(), expected, atol=1e-4, rtol=1e-4)


def test_solver_equals_explicit_obs_nm_with_masks_from_updated_weights():
    w, x = problem(seed=1)
    h = 2 * x.T @ x
    pruned, mask = sparsegpt_solve(w, h, 0.5, nm=(2, 4), blocksize=128)
    expected, expected_mask = explicit_obs(w, h, nm=(2, 4))
    assert torch.equal(mask, expected_mask)
    torch.testing.assert_close(pruned.double(), expected, atol=1e-4, rtol=1e-4)


def test_lazy_blocks_give_the_same_result_as_one_block():
    w, x = problem(rows=4, cols=16, seed=2)
    h = 2 * x.T @ x
    one, _ = sparsegpt_solve(w, h, 0.5, nm=(2, 4), blocksize=16)
    lazy, _ = sparsegpt_solve(w, h, 0.5, nm=(2, 4), blocksize=4)
    torch.testing.assert_close(one, lazy, atol=1e-5, rtol=1e-5)


def test_dead_inputs_are_zeroed_and_do_not_break_the_factorisation():
    w, x = problem(seed=3)
    x[:, 2] = 0  # channel 2 never fires
    pruned, _ = sparsegpt_solve(w, 2 * x.T @ x, 0.25)
    assert bool((pruned[:, 2] == 0).all()) and torch.isfinite(pruned).all()


def test_reference_ties_prune_k_plus_one_per_block():
    w = torch.ones(2, 4)
    w[0, 0] = 0.5
    pruned, mask = sparsegpt_solve(w, torch.eye(4), 0.25, ties="reference")  # k = 2, threshold = 1: all
    assert int(mask.sum()) == 8
    _, exact = sparsegpt_solve(w, torch.eye(4), 0.25)
    assert int(exact.sum()) == 2


def test_factor_in_the_hessians_own_memory_is_bit_for_bit_the_copying_one():
    w, x = problem(rows=8, cols=256, tokens=512)
    h = 2 * x.T @ x / 512
    h[:, 3] = h[3, :] = 0  # a dead input
    copied, dead = inverse_hessian_factor(h, 0.01)
    overwritten = h.clone()
    in_place, dead_in_place = inverse_hessian_factor(overwritten, 0.01, overwrite=True)
    assert in_place.data_ptr() == overwritten.data_ptr()  # no [in, in] copy kept
    assert torch.equal(in_place, copied) and torch.equal(dead_in_place, dead)
    assert torch.equal(torch.triu(copied), copied)  # the upper factor
    for nm in (None, (2, 4)):  # one factor shared by the linears that read the same input
        assert all(torch.equal(a, b) for a, b in zip(solve_with_factor(w, (in_place, dead), 0.5, nm),
                                                      sparsegpt_solve(w, h, 0.5, nm)))


def test_row_group_mask_is_chosen_up_front_with_s_of_every_row():
    w, x = problem(seed=6)
    pruned, mask = sparsegpt_solve(w, 2 * x.T @ x, 0.5, group="row")
    assert mask.sum(dim=1).tolist() == [4] * 6 and bool((pruned[mask] == 0).all())


def test_hessian_is_the_reference_running_average():
    g = torch.Generator().manual_seed(4)
    batches = [(torch.randn(10, 3, generator=g), 2), (torch.randn(5, 3, generator=g), 1)]  # 3 samples
    stat = Hessian(3)
    for x, samples in batches:
        stat.update(x, samples)
    x = torch.cat([b for b, _ in batches])
    torch.testing.assert_close(stat.value, 2 / 3 * x.T @ x)


def context(model_dir, seed=0):
    loaded = load_model(ModelSpec(name_or_path=str(model_dir), device="cpu"))
    samples = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(seed))
    return PruneContext(loaded, seed, lambda: samples, batch_size=2, progress=False)


def linear_inputs(ctx, layer_index=0) -> dict[str, torch.Tensor]:
    """Inputs of one layer's linears over the calibration samples, from the dense model."""
    linears = ctx.loaded.adapter.linears(ctx.loaded.adapter.layers[layer_index])
    seen = {name: [] for name in linears}
    handles = [lin.register_forward_hook(lambda m, a, o, n=name: seen[n].append(a[0].detach()))
               for name, lin in linears.items()]
    with torch.no_grad():
        ctx.loaded.model(input_ids=ctx.calibration(), use_cache=False)
    for h in handles:
        h.remove()
    return {name: torch.cat(xs).reshape(-1, linears[name].in_features) for name, xs in seen.items()}


def test_reconstruction_error_on_calibration_inputs_is_lower_than_wandas(tiny_model_dirs):
    """||W X - W' X||^2 of every linear of layer 0 (whose inputs both methods see dense), at equal
    zero counts (`ties: exact`; the reference's threshold rule prunes one more entry per block)."""
    pruned = {}
    for method in (Wanda(sparsity=0.5), SparseGPT(sparsity=0.5, ties="exact")):
        ctx = context(tiny_model_dirs["llama"])
        layer0 = ctx.loaded.adapter.linears(ctx.loaded.adapter.layers[0])
        dense = {k: lin.weight.detach().clone() for k, lin in layer0.items()}  # [out, in] each
        inputs = linear_inputs(ctx)  # [tokens, in] each
        method.prune(ctx, method.allocate(ctx))
        pruned[method.name] = {k: lin.weight.detach() for k, lin in layer0.items()}
    for name, x in inputs.items():
        error = {m: float(((x @ dense[name].T - x @ w[name].T) ** 2).sum()) for m, w in pruned.items()}
        assert (pruned["sparsegpt"][name] == 0).sum() == (pruned["wanda"][name] == 0).sum()
        assert error["sparsegpt"] < 0.95 * error["wanda"], name


@pytest.mark.parametrize("arch,pattern,true_sequential", [
    ("llama", "2:4", False), ("gpt_neox", "4:8", True), ("opt", "2:4", True), ("qwen3", "4:8", False),
])
def test_nm_pattern_holds_on_every_row_of_every_linear(tiny_model_dirs, arch, pattern, true_sequential):
    n, m = map(int, pattern.split(":"))
    ctx = context(tiny_model_dirs[arch])
    method = SparseGPT(sparsity=n / m, sparsity_type=pattern, true_sequential=true_sequential)
    method.prune(ctx, method.allocate(ctx))
    assert_nm_pattern(ctx.loaded.adapter, n, m)


def test_unstructured_on_a_model_is_deterministic_and_true_sequential_changes_it(tiny_model_dirs):
    weights = []
    for true_sequential in (False, False, True):
        ctx = context(tiny_model_dirs["llama"], seed=1)
        method = SparseGPT(sparsity=0.5, true_sequential=true_sequential)
        report = method.prune(ctx, method.allocate(ctx))
        weights.append({k: lin.weight.clone() for k, lin in ctx.loaded.adapter.prunable_linears().items()})
        for lin in ctx.loaded.adapter.prunable_linears().values():
            # the reference's threshold rule: k + 1 zeros in every 128-column block (no ties here)
            out, cols = lin.weight.shape
            blocks = [out * min(128, cols - start) for start in range(0, cols, 128)]
            assert int((lin.weight == 0).sum()) == sum(int(b * 0.5) + 1 for b in blocks)
    assert report.details["allocation"]["policy"] == "uniform"
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not torch.equal(weights[0]["layers.0.mlp.down_proj"], weights[2]["layers.0.mlp.down_proj"])


@pytest.mark.parametrize("kwargs,message", [
    (dict(blocksize=64), "multiple of the mask group width 128"),
    (dict(sparsity=0.5, sparsity_type="4:8", blocksize=4), "width 8"),
    (dict(percdamp=-1), "percdamp"),
    (dict(ties="sometimes"), "pruning.ties"),
])
def test_bad_settings_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        SparseGPT(**kwargs)
