"""Diagnosis of prunelab-gpu-check row (c) on a GPU: Wanda on the TinyLlama-1.1B shape (random
weights, random calibration ids, the check's full sizes) resident twice, streamed without a memory
cap and streamed under the check's cap; the mask entries that differ between each pair, and the
first linears where resident and streamed differ. On an H200 (results/benchmarks/gpu_check_h200/)
it showed that the cap was not the cause (streamed = streamed under the cap) and that the two paths
differed from layer 0's MLP on: the streamed skeleton's rotary frequencies were computed on the GPU.

    python experiments/benchmarks/gpu_streamed_vs_resident.py [cuda|cpu]   # float16 on CUDA, float32 on the CPU
"""
import sys, tempfile, time, torch
from pathlib import Path
import prunelab
from prunelab.gpu_check.context import CheckContext, FULL, QUICK, Testbed
from prunelab.gpu_check.shapes import random_ids, saved_random_model
from prunelab.gpu_check.measure import decoder_masks, differing_entries, free_device_memory
from prunelab.gpu_check.memory_checks import memory_limit, device_estimate
from prunelab.models import ModelSpec, load_model
from prunelab.models.loading import MemoryRequest

dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
sizes = FULL if dev.type == "cuda" else QUICK
with tempfile.TemporaryDirectory() as work:
    ctx = CheckContext(dev, sizes, Testbed(sizes), Path(work), [])
    shape = ctx.shape("tinyllama_1b")
    config = shape.config()
    nsamples, seqlen = sizes.streamed_tokens
    ids = random_ids(config.vocab_size, nsamples, seqlen)
    for dtype in ((torch.float16,) if dev.type == "cuda" else (torch.float32,)):  # the H200 run before the fix: also float32
        t = time.time()
        name = str(dtype).removeprefix("torch.")
        folder = saved_random_model(config, Path(work) / f"m_{name}", ctx.testbed.tokenizer, dev, dtype)

        def run(streaming, memory=None):
            loaded = load_model(ModelSpec(str(folder), device=str(dev), dtype=name, streaming=streaming), memory=memory)
            try:
                prunelab.prune(loaded.model, loaded.tokenizer, "wanda", 0.5, ids, progress=False)
                return decoder_masks(loaded.model), loaded.mode
            finally:
                del loaded
                free_device_memory(dev)

        A, mA = run(False)
        A2, _ = run(False)
        B, mB = run(True)
        need = device_estimate(config, dtype, (nsamples, seqlen))
        between = (need.streamed + need.resident) // 2 - need.baseline
        with memory_limit(dev, between) as (budget, limit):
            C, mC = run("auto", MemoryRequest(nsamples * seqlen, batch_tokens=seqlen, budget_bytes=budget))
        per_layer = {}
        for key in A:
            layer = key.split(".")[2] if key.count(".") > 2 else key
            d = int((A[key] != B[key]).sum())
            if d:
                per_layer[key] = d
        first = sorted(per_layer.items(), key=lambda kv: int(kv[0].split("layers.")[1].split(".")[0]) if "layers." in kv[0] else 0)[:6]
        print(f"{name}: resident vs resident {differing_entries(A, A2)}; resident vs streamed, no cap ({mB}) {differing_entries(A, B)}; "
              f"resident vs streamed under cap ({mC}) {differing_entries(A, C)}; streamed vs streamed under cap {differing_entries(B, C)}; "
              f"first linears differing (resident vs streamed): {first}; {time.time() - t:.1f} s", flush=True)
