"""(c) a streamed run under a memory limit gives the resident run's masks; (d) a model larger than
the limit is refused in one line, before any weight is read.

On a GPU the limit is the CUDA allocator's cap (`torch.cuda.set_per_process_memory_fraction`),
which the loader's planner reads (`models.checks.cuda_memory_cap`) and the allocator enforces. On
the CPU nothing enforces one: the limit is the run's budget (`runtime.memory_budget_gb`), which
the planner plans against, and the row says that it was not enforced.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from prunelab.gpu_check.context import CheckContext
from prunelab.gpu_check.measure import (
    MASK_TOLERANCE, CheckFailed, NotApplicable, Row, decoder_masks, differing_entries, free_device_memory,
    mask_summary, measure,
)
from prunelab.gpu_check.shapes import random_ids, saved_random_model
from prunelab.models.checks import cuda_memory_cap
from prunelab.models.memory import (
    gib, peak_device_memory, peak_rss, private_memory, reset_peak_device_memory, reset_peak_rss,
)


@contextmanager
def memory_limit(device: torch.device, nbytes: int) -> Iterator[tuple[int | None, str]]:
    """Limit what a load may hold to `nbytes` beyond what the process holds now. Yields (the
    MemoryRequest's budget_bytes, the limit in words). On a GPU: the allocator's cap, lifted on exit
    (budget None: the planner reads the cap); on the CPU: a run budget, not enforced."""
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index  # the setter needs one
        cap = torch.cuda.memory_reserved(index) + nbytes
        total = torch.cuda.mem_get_info(index)[1]
        fraction = min(1.0, cap / total)
        torch.cuda.set_per_process_memory_fraction(fraction, index)
        try:
            if cuda_memory_cap(device) is None:
                raise NotApplicable(f"this torch ({torch.__version__}) cannot report the process's memory fraction "
                                    "(torch.cuda.get_per_process_memory_fraction): the planner cannot see a cap")
            yield None, f"a GPU memory cap of {gib(cap)} (set_per_process_memory_fraction({fraction:.4f}))"
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, index)
    else:
        budget = private_memory() + nbytes
        yield budget, (f"a host memory budget of {gib(budget)} (runtime.memory_budget_gb: planned against, "
                       "not enforced on the CPU)")


def device_estimate(config, dtype: torch.dtype, tokens: tuple[int, int]):
    """The loader's estimate for Wanda with `tokens` of calibration (models.memory.estimate)."""
    from prunelab.models.memory import estimate

    nsamples, seqlen = tokens
    return estimate(config, dtype, nsamples * seqlen, batch_tokens=seqlen)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        reset_peak_device_memory(device)
    else:
        reset_peak_rss()


def peak(device: torch.device) -> int:
    return peak_device_memory(device) if device.type == "cuda" else peak_rss()


# --- (c) streamed under a limit = resident ------------------------------------------------------------
def check_streamed_under_limit(ctx: CheckContext) -> list[Row]:
    shape = ctx.shape("tinyllama_1b")
    limit = "a GPU memory cap" if ctx.on_gpu else "a host memory budget"
    return [measure(f"c: wanda streamed under {limit} = resident, {shape.name}", ctx.device,
                    lambda: streamed_equals_resident(ctx, shape))]


def streamed_equals_resident(ctx: CheckContext, shape) -> str:
    """Prune the saved shape resident, then under a limit between the streamed and the resident
    estimate with model.streaming=auto: the planner must stream, the run fit, the masks agree."""
    import prunelab
    from prunelab.models import ModelSpec, load_model
    from prunelab.models.loading import MemoryRequest

    folder = saved_random_model(shape.config(), ctx.work_dir / shape.base, ctx.testbed.tokenizer, ctx.device,
                                ctx.shape_dtype)
    nsamples, seqlen = ctx.sizes.streamed_tokens
    config = shape.config()
    ids = random_ids(config.vocab_size, nsamples, seqlen)
    dtype = str(ctx.shape_dtype).removeprefix("torch.")

    def pruned_masks(streaming, memory=None) -> tuple[dict, str, int]:
        reset_peak(ctx.device)
        loaded = load_model(ModelSpec(str(folder), device=str(ctx.device), dtype=dtype, streaming=streaming),
                            memory=memory)
        try:
            prunelab.prune(loaded.model, loaded.tokenizer, "wanda", 0.5, ids, progress=False)
            return decoder_masks(loaded.model), loaded.mode, peak(ctx.device)
        finally:
            del loaded
            free_device_memory(ctx.device)

    expected, _, resident_peak = pruned_masks(False)
    need = device_estimate(config, ctx.shape_dtype, (nsamples, seqlen))
    between = (need.streamed + need.resident) // 2 - need.baseline  # above streamed, below resident
    with memory_limit(ctx.device, between) as (budget, limit):
        request = MemoryRequest(nsamples * seqlen, batch_tokens=seqlen, budget_bytes=budget)
        got, mode, streamed_peak = pruned_masks("auto", request)
    if mode != "streamed":
        raise CheckFailed(f"under {limit} the planner kept the model resident (estimated resident "
                          f"{gib(need.resident - need.baseline)}, streamed {gib(need.streamed - need.baseline)})")
    differ, total = differing_entries(expected, got)
    words = (f"under {limit}: streamed, {mask_summary(differ, total)}; peak memory resident "
             f"{gib(resident_peak)}, streamed {gib(streamed_peak)}")
    if differ > MASK_TOLERANCE * total:
        raise CheckFailed(f"{words}; allowed: {100 * MASK_TOLERANCE:g}% of mask entries")
    return words


# --- (d) a model larger than the limit refused in one line ------------------------------------------
def check_refusal(ctx: CheckContext) -> list[Row]:
    limit = "a GPU memory cap" if ctx.on_gpu else "a host memory budget"
    return [measure(f"d: llama2_7b larger than {limit}: refused", ctx.device, lambda: refused_in_one_line(ctx))]


def refused_in_one_line(ctx: CheckContext) -> str:
    """Load the full 7B shape's config (no weights exist: nothing is allocated) resident under a
    limit of half its estimate: the loader must refuse it with one line naming the budget."""
    from prunelab.errors import ModelCheckError
    from prunelab.models import ModelSpec, load_model
    from prunelab.models.loading import MemoryRequest
    from prunelab.gpu_check.shapes import shape

    full = shape("llama2_7b")  # never shrunk: only its config is written
    folder = ctx.work_dir / "llama2_7b_config_only"
    full.config().save_pretrained(folder)
    tokens = ctx.sizes.paper_tokens
    need = device_estimate(full.config(), ctx.shape_dtype, tokens)
    held = torch.cuda.memory_allocated(ctx.device) if ctx.on_gpu else None
    spec = ModelSpec(str(folder), device=str(ctx.device), dtype=str(ctx.shape_dtype).removeprefix("torch."))
    with memory_limit(ctx.device, (need.resident - need.baseline) // 2) as (budget, words):
        try:
            load_model(spec, memory=MemoryRequest(tokens[0] * tokens[1], batch_tokens=tokens[1], budget_bytes=budget))
        except ModelCheckError as err:
            message = str(err)
        else:
            raise CheckFailed(f"{full.name} loaded under {words}: it should have been refused")
    if "\n" in message or "budget is" not in message:
        raise CheckFailed(f"the refusal is not one line naming the budget: {message[:300]!r}")
    if held is not None and torch.cuda.memory_allocated(ctx.device) != held:
        raise CheckFailed(f"refused, but after allocating GPU memory: {message}")
    return f"under {words}: {message}"
