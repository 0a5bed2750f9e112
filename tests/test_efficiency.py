"""The efficiency evaluator and the pruning-cost counters: counted cost from a real forward, timing
alternated side by side, the record and the last line, one-line refusals of bad settings."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from test_cli import tiny_run_overrides
from transformers import AutoModelForCausalLM, AutoTokenizer

import prunelab
from prunelab.api import efficiency_summary
from prunelab.errors import ConfigError
from prunelab.evaluation.cost import count_cost
from prunelab.evaluation.efficiency import EfficiencyMeasurement, EfficiencySpec, sparse_kernels_usable
from prunelab.evaluation.timing import alternated_times, speedup
from prunelab.models import ModelAdapter

QUICK = EfficiencySpec(measure="always", prefill_grid=((1, 16), (2, 8)), decode_context=8, new_tokens=4,
                       repeats=3, warmup=1)


@pytest.fixture
def llama(tiny_model_dirs):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"]).eval()


def without_layers(model, layers):
    pruned = copy.deepcopy(model)
    ModelAdapter(pruned).remove_layers(layers)
    return pruned


def test_flops_shrink_by_one_layers_worth_per_removed_layer_and_the_kv_cache_with_them(llama):
    full, one, two = (count_cost(m, 16) for m in (llama, without_layers(llama, [1]), without_layers(llama, [1, 2])))
    per_layer = full.flops_prefill - one.flops_prefill
    assert per_layer > 0 and one.flops_prefill - two.flops_prefill == per_layer
    assert full.flops_decode - one.flops_decode == one.flops_decode - two.flops_decode > 0
    config = llama.config
    head_dim = config.hidden_size // config.num_attention_heads
    # keys and values, fp32, per layer and kv head
    assert full.kv_bytes_per_token == 2 * 4 * config.num_hidden_layers * config.num_key_value_heads * head_dim
    assert two.kv_bytes_per_token * config.num_hidden_layers == full.kv_bytes_per_token * (config.num_hidden_layers - 2)
    assert two.parameters < one.parameters < full.parameters and full.weight_bytes == 4 * full.parameters


def test_a_mask_saves_nonzeros_but_no_flop(llama):
    masked = copy.deepcopy(llama)
    adapter = ModelAdapter(masked)
    weight = adapter.linear_weights(adapter.layers[0])[-1]  # the layer's last linear (the MLP's output)
    with torch.no_grad():
        weight[:, ::2] = 0
    dense, pruned = count_cost(llama, 16), count_cost(masked, 16)
    assert pruned.flops_prefill == dense.flops_prefill and pruned.parameters == dense.parameters
    assert dense.nonzero_parameters - pruned.nonzero_parameters == weight.numel() // 2


def test_timing_alternates_the_order_and_speedup_is_the_ratio_of_medians():
    calls = []
    works = {name: (lambda n=name: calls.append(("prepare", n)) or (lambda: calls.append(("run", n))))
             for name in ("dense", "pruned")}
    times = alternated_times(works, torch.device("cpu"), repeats=3, warmup=1)
    runs = [n for kind, n in calls if kind == "run"]
    assert runs == ["dense", "pruned", "dense", "pruned", "pruned", "dense", "dense", "pruned"]
    assert len(times["dense"]) == len(times["pruned"]) == 3
    result = speedup([2.0, 4.0, 3.0], [1.0, 1.0, 1.5])
    assert result["speedup"] == 3.0 / 1.0 and result["ratios"] == [2.0, 4.0, 2.0]


def test_removing_half_the_layers_is_measured_faster_than_dense(llama):
    """Half the layers is about 2x faster; the test asks for 1.2x. Under load (another job on these
    2 cores) one measurement of a model this small can land below 1 (measured: 0.69 once in 4 at
    load 2.5), so the measurement is repeated up to 3 times and one clear speedup is enough: a
    measurement that confused or mis-timed the two models would show < 1 every time."""
    pruned = without_layers(llama, [0, 1])
    spec = EfficiencySpec(measure="always", prefill_grid=((16, 128),), decode_context=16, new_tokens=16,
                          repeats=9, warmup=1)
    for _attempt in range(3):
        measurement = EfficiencyMeasurement(spec, torch.device("cpu"), None, count_cost(llama, spec.decode_context))
        section = measurement.measure(llama, pruned)
        if section["speedup"]["prefill"] > 1.2 and section["speedup"]["decode"] > 1.2:
            break
    assert section["counted"]["ratio"]["kv_bytes_per_token"] == 0.5
    assert section["speedup"]["prefill"] > 1.2 and section["speedup"]["decode"] > 1.2, section["speedup"]
    assert section["sparse_kernels"] == {"used": False, "reason": sparse_kernels_usable(torch.device("cpu"), None)[1]}
    metrics = measurement.metrics()
    assert metrics["speedup/prefill"].higher_is_better and not metrics["cost/flops_prefill"].higher_is_better
    assert metrics["cost/kv_bytes"].value == 0.5 and metrics["speedup/decode"].protocol["threads"] == 1


def test_bad_settings_are_one_line_before_any_work(llama):
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError, match="exceed the model's max_position_embeddings=128"):
        EfficiencySpec(prefill_grid=((1, 256),)).check(llama, cpu, None, None, 0)
    with pytest.raises(ConfigError, match="GiB are free"):
        EfficiencySpec(prefill_grid=((4096, 64),), decode_context=16).check(llama, cpu, None, 2**28, 0)
    with pytest.raises(ConfigError, match="need a CUDA GPU"):
        EfficiencySpec(sparse_kernels="require", prefill_grid=((1, 16),), decode_context=16).check(llama, cpu, "2:4", None, 0)
    with pytest.raises(ConfigError, match="no sparse kernel: PyTorch has none for unstructured"):
        EfficiencySpec(sparse_kernels="require", prefill_grid=((1, 16),), decode_context=16).check(llama, cpu, "unstructured", None, 0)
    with pytest.raises(ConfigError, match=r"prefill_grid=\[\[1\]\]: give \[batch, seqlen\] pairs"):
        EfficiencySpec(prefill_grid=[[1]])
    with pytest.raises(ConfigError, match="measure='sometimes'"):
        EfficiencySpec(measure="sometimes")
    broken = copy.deepcopy(llama)
    ModelAdapter(broken).layers[0].forward = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("custom kernel"))
    with pytest.raises(ConfigError, match="the FLOP counter cannot follow this model .RuntimeError: custom kernel"):
        count_cost(broken, 8)


def _record(tmp_path):
    (path,) = (tmp_path / "records").rglob("result.json")
    return json.loads(path.read_text())


def test_a_depth_run_records_its_speedup_and_says_it_last(tiny_model_dirs, text_file, tmp_path):
    def run(recovery):
        return prunelab.run(tiny_run_overrides(tiny_model_dirs["llama"], text_file, tmp_path / recovery) + [
            "pruning=depth", "pruning.num_layers=2", f"recovery={recovery}", "evaluation=ppl",
            "evaluation.efficiency.prefill_grid=[[2,64]]", "evaluation.efficiency.decode_context=16",
            "evaluation.efficiency.new_tokens=8"])

    record, plain = run("ghosted"), run("none")
    section = record["efficiency"]
    assert section["measured"] and section["counted"]["ratio"]["flops_prefill"] < 0.75
    assert record["metrics"]["pruned"]["speedup/prefill"]["value"] == section["speedup"]["prefill"]
    # Ghosted's boundary operators are part of the counted (and timed) model: d x d weights, 2 d^2 FLOPs a token
    hidden, tokens = 32, section["counted"]["pruned"]["context"]
    extra = section["counted"]["pruned"]["parameters"] - plain["efficiency"]["counted"]["pruned"]["parameters"]
    assert extra > 0 and extra % (hidden * hidden) == 0
    operators = extra // (hidden * hidden)
    assert section["counted"]["pruned"]["flops_prefill"] - plain["efficiency"]["counted"]["pruned"]["flops_prefill"] \
        == operators * 2 * hidden * hidden * tokens
    assert _record(tmp_path / "ghosted")["efficiency"]["speedup"] == section["speedup"]
    from prunelab.api import summary_line
    from prunelab.tracking.wandb_tracker import efficiency_grid

    columns, rows = efficiency_grid(record)  # the W&B table: each prefill point and the decode
    assert [row[0] for row in rows] == ["prefill", "decode"] and rows[0][columns.index("speedup")] == \
        section["prefill"][0]["speedup"]
    assert f"speedup prefill {section['speedup']['prefill']:.2f}x, decode {section['speedup']['decode']:.2f}x" \
        in summary_line(record)
    cost = record["pruning_cost"]
    assert cost["stages"]["score"]["forward_passes"] == 1.0  # block influence: one pass over the data
    assert cost["total"]["backward_passes"] == 0


def test_unstructured_wanda_is_measured_on_request_and_says_no_sparse_kernel_ran(tiny_model_dirs, text_file, tmp_path):
    overrides = tiny_run_overrides(tiny_model_dirs["llama"], text_file, tmp_path) + [
        "pruning=wanda", "evaluation=ppl", "evaluation.efficiency.measure=always",
        "evaluation.efficiency.prefill_grid=[[16,64]]", "evaluation.efficiency.repeats=9",
        "evaluation.efficiency.decode_context=16", "evaluation.efficiency.new_tokens=8"]
    record = prunelab.run(overrides)  # [2, 64] x 5 repeats measured 3.5x at load 3.7 on 2 cores: too little work to time
    section = record["efficiency"]
    assert section["counted"]["ratio"]["flops_prefill"] == 1.0
    assert section["counted"]["ratio"]["nonzero_parameters"] < 0.8
    assert not section["sparse_kernels"]["used"] and "unstructured" in section["sparse_kernels"]["reason"]
    assert 0.5 < section["speedup"]["prefill"] < 2.0  # the same kernels: no real speedup to find
    from prunelab.api import summary_line

    assert "no sparse kernel used" in summary_line(record)


def test_a_default_grid_the_model_cannot_hold_is_recorded_under_auto_and_refused_under_always(
        tiny_model_dirs, text_file, tmp_path):
    depth = tiny_run_overrides(tiny_model_dirs["llama"], text_file, tmp_path) + [
        "pruning=depth", "pruning.num_layers=1", "evaluation=ppl"]  # the default grid: 256 > 128 positions
    record = prunelab.run(depth)
    assert record["status"] == "completed" and not record["efficiency"]["measured"]
    assert "max_position_embeddings=128" in record["efficiency"]["reason"]
    with pytest.raises(ConfigError, match="measure=always: evaluation.efficiency: sequences of 256 tokens"):
        prunelab.run(depth + ["evaluation.efficiency.measure=always", "runtime.skip_completed=false"])
    (aside,) = (tmp_path / "records").rglob("result.failed-*.json")  # the completed record is kept
    failed = json.loads(aside.read_text())
    assert failed["status"] == "failed" and "prune" not in failed["timings"]


def test_weight_pruning_is_not_timed_by_default(tiny_model_dirs, text_file, tmp_path):
    record = prunelab.run(tiny_run_overrides(tiny_model_dirs["llama"], text_file, tmp_path) + [
        "pruning=magnitude", "evaluation=ppl"])
    assert "efficiency" not in record and not any(k.startswith("speedup/") for k in record["metrics"]["pruned"])


# SLEB's one step on 18 layers: 16 candidates share a pass through layers 0..16 (17 layer calls),
# then candidate k runs the 17 - k layers after it: 17 + 136 = 153 layer calls, not 16 x 17 = 272
@pytest.mark.parametrize("scorer,forward,backward", [("wrp", 0.0, 0.0), ("block_influence", 1.0, 0.0),
                                                     ("shortened_taylor", None, 1.0), ("sleb", 153 / 18, 0.0)])
def test_pruning_cost_counts_each_scorers_passes(scorer, forward, backward):
    path = prunelab.shipped_model("testbed_llama")  # 18 layers: room for Shortened's protected ones
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    ids = torch.randint(0, model.config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))
    report = prunelab.prune(model, tokenizer, method="depth", scorer=scorer, num_layers=1, calibration=ids,
                            progress=False)
    score = report["pruning_cost"]["stages"]["score"]
    assert report["pruning_cost"]["calibration_tokens"] == (ids.numel() if scorer != "wrp" else 0)
    if forward is not None:
        assert score["forward_passes"] == forward
    assert score["backward_passes"] == backward
    assert (score["backward_calls"] > 0) == (backward > 0)


def test_a_timing_on_a_busy_machine_is_recorded_and_said(monkeypatch, llama):
    """Other processes on every CPU widen the paired ratios far beyond the benchmark's band (a
    decode speedup of 1.02x and 1.36x for the same 6 layers removed): the record must say so."""
    from prunelab.evaluation import timing

    quiet = timing.busy_while_timing({"load_average": 0.9, "cpus": 2}, {"load_average": 1.1, "cpus": 2})
    assert not quiet["busy"]
    busy = timing.busy_while_timing({"load_average": 0.9, "cpus": 2}, {"load_average": 4.2, "cpus": 2})
    assert busy["busy"] and busy["load_average_after"] == 4.2
    monkeypatch.setattr(timing, "machine_load", lambda: {"load_average": 7.5, "cpus": 2})
    monkeypatch.setattr("prunelab.evaluation.efficiency.machine_load", timing.machine_load)
    spec = EfficiencySpec(prefill_grid=[[1, 8]], decode_context=8, new_tokens=2, repeats=1, warmup=0)
    pruned = copy.deepcopy(llama)
    measurement = EfficiencyMeasurement(spec, torch.device("cpu"), None, count_cost(llama, 8))
    section = measurement.measure(llama, pruned)
    assert section["protocol"]["machine_load"]["busy"]
    assert "timed on a busy machine" in ", ".join(efficiency_summary({"efficiency": {"measured": True, **section}}))
    assert "machine_load" not in measurement.metrics()["speedup/decode"].protocol  # runs still pool
