"""The GPU path checked on a CPU-only machine: what a run does with the CUDA allocator, the clock and
the caches when its model is on a GPU, with torch.cuda's functions patched to stand in for one."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from prunelab.models import ModelSpec, cache_identity, load_model, model_identity
from prunelab.models.memory import GIB
from prunelab.pipeline import StageClock
from prunelab.tracking import environment


class FakeAllocator:
    """torch.cuda's peak statistics and synchronisation, as a GPU would keep them."""

    def __init__(self, monkeypatch):
        self.allocated = 0  # bytes held now
        self.peak = 0  # since the last reset
        self.events: list[str] = []
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: self.events.append("sync"))
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.peak)

    def reset(self, device=None) -> None:
        self.events.append("reset")
        self.peak = self.allocated

    def hold(self, nbytes: int) -> None:
        self.allocated = nbytes
        self.peak = max(self.peak, nbytes)


def test_each_stage_reports_its_own_gpu_peak_and_waits_for_its_kernels(monkeypatch):
    gpu = FakeAllocator(monkeypatch)
    clock = StageClock()
    clock.device = torch.device("cuda", 0)
    with clock("score"):
        gpu.hold(8 << 30)
        gpu.hold(1 << 30)  # the scores freed: 1 GiB stays
    with clock("prune"):
        gpu.hold(2 << 30)
    # without the reset at each start, prune would report score's 8 GiB
    assert clock.peak_device == {"score": 8 << 30, "prune": 2 << 30}
    # every stage: synchronise and reset before its clock starts, synchronise before it stops
    assert gpu.events[:3] == ["sync", "reset", "sync"] and gpu.events.count("reset") == 2


def test_a_stage_timer_stops_when_the_device_is_done(monkeypatch):
    """CUDA launches return at once: the stage's time must include its queued kernels."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: time.sleep(0.2))  # the queue drains
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 0)
    clock = StageClock()
    clock.device = torch.device("cuda")
    with clock("prune"):
        pass  # the launches: no time on the host
    assert clock.timings["prune"] >= 0.2
    cpu = StageClock()
    with cpu("prune"):
        pass
    assert "prune" not in cpu.peak_device and cpu.timings["prune"] < 0.2


def test_the_record_names_the_gpu_its_memory_and_the_cuda_and_driver_versions(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(
        name="NVIDIA H200", total_memory=150_000_000_000, major=9, minor=0))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(environment, "cuda_driver_version", lambda: "570.86")
    facts = environment.gpu_facts()
    assert facts == {"gpus": [{"name": "NVIDIA H200", "memory_bytes": 150_000_000_000, "capability": "9.0"}],
                     "cuda": "12.8", "cuda_driver": "570.86"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert environment.hardware()["gpus"] == [] and environment.hardware()["cuda_driver"] is None


def test_cached_numbers_are_keyed_by_device_and_dtype(tiny_model_dirs):
    """A CUDA bfloat16 run must not reuse a CPU float32 run's dense perplexity or statistics; the
    records' pairing key (the weights' identity) stays the same."""
    loaded = load_model(ModelSpec(name_or_path=str(tiny_model_dirs["llama"]), device="cpu"))
    on_cpu = cache_identity(loaded)
    assert on_cpu["computed_on"] == {"device": "cpu", "dtype": "float32"}
    loaded.model.to(torch.bfloat16)
    as_bf16 = cache_identity(loaded)
    loaded.device = torch.device("meta")  # stands in for another device
    elsewhere = cache_identity(loaded)
    assert len({str(on_cpu), str(as_bf16), str(elsewhere)}) == 3
    assert {k: v for k, v in as_bf16.items() if k != "computed_on"} == model_identity(loaded)


# --- memory planned against the device that holds it ------------------------------------------------
def llama_13b_config():
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                       num_attention_heads=40, num_key_value_heads=40, vocab_size=32000)


def plan(monkeypatch, streaming, gpu_free_gib: float, host_gib: float = 256, tokens: int = 128 * 2048):
    from prunelab.models.loading import MemoryRequest, choose_memory_mode

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(gpu_free_gib * GIB), 24 * GIB))
    spec = ModelSpec(name_or_path="meta-llama/Llama-2-13b-hf", dtype="float16", device="cuda",
                     streaming=streaming)
    request = MemoryRequest(activation_tokens=tokens, batch_tokens=2048, budget_bytes=int(host_gib * GIB))
    return choose_memory_mode(spec, llama_13b_config(), request, torch.device("cuda", 0))


def test_a_13b_model_on_a_24gib_gpu_streams_instead_of_running_out_of_gpu_memory(monkeypatch):
    """26 GB of float16 weights fit the node's 256 GiB of RAM, not the card: planned against the
    host (the old planner) the run was resident and died in .to(device) with a CUDA OOM."""
    mode, record = plan(monkeypatch, "auto", gpu_free_gib=23.5)
    assert mode == "streamed"
    assert "mem_get_info" in record["budget_from"] and record["budget_bytes"] == int(23.5 * GIB)
    assert record["host_budget_bytes"] == 256 * GIB and record["activations_on"] == "device"


def test_a_model_the_gpu_cannot_hold_is_refused_in_one_line_naming_both_numbers(monkeypatch):
    from prunelab.errors import ModelCheckError

    with pytest.raises(ModelCheckError) as err:
        plan(monkeypatch, False, gpu_free_gib=23.5)
    message = str(err.value)
    assert "\n" not in message and "23.50 GiB" in message and "cuda:0" in message
    assert "model.streaming=true" in message  # and what would fit


def test_a_memory_cap_of_this_process_is_planned_against_like_a_smaller_gpu(monkeypatch):
    """Under `torch.cuda.set_per_process_memory_fraction` the allocator refuses what the cap does not
    leave, though `mem_get_info` still reports the whole card free: the plan must see the cap."""
    from prunelab.errors import ModelCheckError
    from prunelab.models.checks import free_bytes

    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: 0.25)  # 6 of 24 GiB
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 1 * GIB)  # held by this process
    mode, record = plan(monkeypatch, "auto", gpu_free_gib=23.5)
    assert mode == "streamed" and record["budget_bytes"] == 5 * GIB
    assert "set_per_process_memory_fraction" in record["budget_from"] and "6.00 GiB" in record["budget_from"]
    with pytest.raises(ModelCheckError, match=r"the budget is 5.00 GiB .*set_per_process_memory_fraction"):
        plan(monkeypatch, False, gpu_free_gib=23.5)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: 1.0)  # no cap
    assert free_bytes(torch.device("cuda", 0)) == int(23.5 * GIB)


def test_activations_the_gpu_cannot_hold_go_to_the_host_then_to_disk(monkeypatch):
    tokens = 1024 * 2048  # 2 x 20 GiB of float16 hidden states: not beside a layer on the card
    mode, record = plan(monkeypatch, "auto", gpu_free_gib=23.5, tokens=tokens)
    assert (mode, record["activations_on"], record["activations_spilled"]) == ("streamed", "host", False)
    mode, record = plan(monkeypatch, "auto", gpu_free_gib=23.5, host_gib=16, tokens=tokens)
    assert (record["activations_on"], record["activations_spilled"]) == ("disk", True)


def test_gpu_activations_kept_on_the_host_when_the_device_budget_is_short(tiny_model_dirs):
    from torch._subclasses.fake_tensor import FakeTensorMode

    loaded = load_model(ModelSpec(name_or_path=str(tiny_model_dirs["llama"]), device="cpu", streaming=True))
    store = loaded.adapter.store
    with FakeTensorMode(allow_non_fake_inputs=True):
        on_gpu = torch.empty(2, 8, 16, device="cuda")  # [B, T, C]
        assert store.keep_activation(on_gpu).device.type == "cuda"  # fits: stays where it was made
        store.host_activations = True
        assert store.keep_activation(on_gpu).device.type == "cpu"


def test_new_pure_math_keeps_to_the_device_of_its_inputs():
    """RIA's score and width pruning's row indices on fake CUDA inputs: a tensor made on the CPU
    beside them raises FakeTensorDeviceMismatchError. (Indexed assignment and `flip`, which the
    channel permutation uses, have no fake CUDA kernel on a CPU-only build.)"""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from prunelab.models.width import _unit_rows
    from prunelab.scoring.weights import ria_scores

    with FakeTensorMode(allow_non_fake_inputs=True):
        weight = torch.empty(8, 16, device="cuda")  # [out, in]
        scores = ria_scores(weight, torch.empty(16, device="cuda"))  # [out, in]
        rows = _unit_rows(torch.arange(3, device="cuda"), 64)  # [3 * 64]
        assert scores.device.type == rows.device.type == "cuda"


def test_streamed_wrp_keeps_its_norms_beside_its_rows_on_the_host(tiny_model_dirs):
    """Streamed WRP on a GPU: each layer's writer rows are stacked into a host buffer (the store's
    `empty_activation`), so the layer's norms must follow them there. Left on the GPU (before the
    fix), they meet the host rows in `similarity_parts`: a device mismatch on a GPU, and here an
    error as soon as the fake CUDA norms are sliced."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from prunelab.pruning.scorers.wrp import WeightRedundancy

    loaded = load_model(ModelSpec(name_or_path=str(tiny_model_dirs["llama"]), device="cpu", streaming=True))
    with FakeTensorMode(allow_non_fake_inputs=True):
        layers = [(torch.empty(16, 8, device="cuda"), torch.empty(16, 24, device="cuda"))  # [C, n]
                  for _ in range(3)]
        on_gpu = SimpleNamespace(  # a streamed adapter whose layers come into GPU memory one by one
            store=loaded.adapter.store, num_layers=len(layers),
            layers_in_memory=lambda: iter(enumerate(layers)),
            residual_writers=lambda layer: tuple(SimpleNamespace(weight=w) for w in layer))
        for form in ("gram", "raw"):
            similarity = WeightRedundancy(form)._streamed_matrix(on_gpu, progress=False)["similarity"]
            assert similarity.shape == (3, 3) and similarity.device.type == "cpu"


def test_a_streamed_models_rotary_frequencies_are_computed_on_the_cpu_like_a_resident_ones(tiny_model_dirs,
                                                                                           monkeypatch):
    """Computed on a GPU, `inv_freq` differs from the CPU's in its last bit: on an H200 a streamed
    run (skeleton built with its rotary embedding on the GPU) flipped 0.12-0.14% of Wanda's mask
    entries against the resident run (from_pretrained on the CPU, then moved). The skeleton's rotary
    embedding is now built on the CPU and moved; `meta` stands in for the GPU."""
    from transformers import AutoModelForCausalLM

    from prunelab.models.architectures import architecture_for
    from prunelab.models.streaming import rebuild_rotary

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"])
    rotary_type = type(model.model.rotary_emb)
    computed_on = []
    original_init = rotary_type.__init__

    def spy(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        computed_on.append(self.inv_freq.device)

    monkeypatch.setattr(rotary_type, "__init__", spy)
    rebuild_rotary(model, architecture_for(model.config.model_type), torch.device("meta"))
    assert computed_on == [torch.device("cpu")]
    assert model.model.rotary_emb.inv_freq.device.type == "meta"
