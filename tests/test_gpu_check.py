"""`prunelab-gpu-check` assembles one table and one JSON: a row per check with its status, time,
peak memory and one-line detail; a family that fails is a failed row with its error and the exit
status is 1. The whole CPU run (`--device cpu --quick`) is CI's (.ci/run), not this file's."""

from __future__ import annotations

import json

import pytest
import torch

from prunelab.gpu_check import main
from prunelab.gpu_check.families import METHOD_FAMILIES
from prunelab.gpu_check.measure import CheckFailed, NotApplicable, differing_entries, mask_summary, measure
from prunelab.gpu_check.shapes import shape

ROW_FIELDS = {"check", "status", "seconds", "peak_memory_bytes", "detail"}


def test_a_failing_family_is_a_failed_row_with_its_one_line_error_and_exit_status_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(METHOD_FAMILIES, "broken", dict(method="wanda", sparsity=0.5, no_such_setting=1))
    output = tmp_path / "report.json"
    status = main(["--device", "cpu", "--quick", "--checks", "a", "--families", "wanda,broken",
                   "--output", str(output)])
    assert status == 1
    report = json.loads(output.read_text())
    assert report["device"]["type"] == "cpu" and report["torch"] == torch.__version__
    assert {"cuda", "prunelab", "libraries", "hardware", "options", "seconds"} <= set(report)
    assert report["passed"] is False and report["failed_checks"] == ["a: broken"]
    wanda, broken = report["rows"]
    assert set(wanda) == ROW_FIELDS == set(broken)
    assert (wanda["check"], wanda["status"]) == ("a: wanda", "ok") and "sparsity 0.500" in wanda["detail"]
    assert wanda["seconds"] > 0 and wanda["peak_memory_bytes"] > 0
    assert broken["status"] == "failed" and broken["detail"].startswith("ConfigError: ")
    assert "no_such_setting" in broken["detail"] and "\n" not in broken["detail"]
    printed = capsys.readouterr()
    assert "a: broken" in printed.out and "failed" in printed.out and "1 ok, 1 failed" in printed.out
    assert "gpu-check: a: wanda ..." in printed.err and "gpu-check: a: broken ..." in printed.err  # progress


def test_a_model_larger_than_the_budget_is_refused_in_one_line_on_the_cpu(tmp_path, capsys):
    """Check (d): the full 7B shape's config, no weights; its CPU analogue is a host budget."""
    output = tmp_path / "report.json"
    assert main(["--device", "cpu", "--quick", "--checks", "d", "--output", str(output)]) == 0
    (row,) = json.loads(output.read_text())["rows"]
    assert row["status"] == "ok" and "budget is" in row["detail"] and "not enforced on the CPU" in row["detail"]


def test_a_step_outcome_becomes_its_rows_status():
    cpu = torch.device("cpu")
    assert measure("fine", cpu, lambda: "done").status == "ok"

    def out_of_tolerance():
        raise CheckFailed("3 of 10 mask entries differ")

    def needs_cuda():
        raise NotApplicable("not applicable on cpu: no allocator cap")

    assert (measure("off", cpu, out_of_tolerance).status, measure("cuda", cpu, needs_cuda).status) == \
        ("failed", "skipped")
    crashed = measure("crash", cpu, lambda: 1 / 0)
    assert crashed.status == "failed" and crashed.detail == "ZeroDivisionError: division by zero"


def test_mask_comparison_counts_differing_entries_and_refuses_other_shapes():
    first = {"layers.0.q": torch.tensor([[True, False], [False, False]])}
    second = {"layers.0.q": torch.tensor([[True, True], [False, False]])}
    assert differing_entries(first, first) == (0, 4) and differing_entries(first, second) == (1, 4)
    assert mask_summary(0, 4) == "identical masks (4 entries)"
    assert mask_summary(1, 4) == "1 of 4 mask entries differ (25.0000%)"
    with pytest.raises(CheckFailed, match="shape"):
        differing_entries(first, {"layers.0.q": torch.zeros(2, 3, dtype=torch.bool)})


def test_the_shipped_shapes_are_llama_2_7b_and_a_1b_and_shrink_for_the_cpu():
    full = shape("llama2_7b").config()
    assert (full.hidden_size, full.intermediate_size, full.num_hidden_layers, full.vocab_size) == (4096, 11008, 32, 32000)
    small = shape("tinyllama_1b", shrunk=True)
    assert small.name == "tinyllama_1b (shrunk)" and small.config().vocab_size == 32000
    assert small.config().num_hidden_layers < shape("tinyllama_1b").config().num_hidden_layers


def test_the_gpu_memory_cap_is_set_seen_by_the_planner_and_lifted(monkeypatch):
    """Check (c)'s and (d)'s limit on a GPU, with torch.cuda's allocator functions standing in."""
    from prunelab.gpu_check.memory_checks import memory_limit
    from prunelab.models.checks import free_bytes

    gib = 1024**3
    fractions = [1.0]
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 1 * gib)  # held already
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (20 * gib, 24 * gib))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device=None: fractions.append(fraction))
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: fractions[-1])
    gpu = torch.device("cuda", 0)
    with memory_limit(gpu, 5 * gib) as (budget, words):
        assert budget is None and "a GPU memory cap of 6.00 GiB" in words  # 1 held + 5 allowed
        assert fractions[-1] == 0.25 and free_bytes(gpu) == 5 * gib  # what the planner plans with
    assert fractions[-1] == 1.0 and free_bytes(gpu) == 20 * gib  # lifted


def test_asking_for_cuda_where_torch_sees_none_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="sees no CUDA GPU; --device cpu runs the CPU version"):
        main(["--device", "cuda"])
