"""The checks that run methods: (a) every family on the testbed, (b) the device against the CPU,
(e) bfloat16 against float32, (f) the papers' protocol on the 7B shape. Each returns its rows
(`measure`); (c) and (d), the memory checks, are in `memory_checks`."""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

from prunelab.gpu_check.context import CheckContext
from prunelab.gpu_check.families import METHOD_FAMILIES
from prunelab.gpu_check.measure import (
    MASK_TOLERANCE, PPL_TOLERANCE, CheckFailed, Row, decoder_masks, differing_entries, free_device_memory,
    mask_summary, measure, relative,
)
from prunelab.gpu_check.shapes import random_ids, random_model
from prunelab.models.memory import synchronize

#: (b): the defaults a device must reproduce, the CPU's masks and perplexity.
AGREEMENT_FAMILIES = ("wanda", "sparsegpt", "magnitude 2:4")
#: (e): relative perplexity difference allowed between bfloat16 and float32 (8 bits of mantissa).
BF16_PPL_TOLERANCE = 0.05
#: (f): the methods timed with the papers' protocol.
PAPER_METHODS = ("wanda", "sparsegpt")


def prune(ctx: CheckContext, model: torch.nn.Module, ids: torch.Tensor, options: dict[str, Any]) -> dict:
    """`prunelab.prune` as a user calls it, quietly (the check prints one line per row)."""
    import prunelab

    return prunelab.prune(model, ctx.testbed.tokenizer, calibration=ids, progress=False,
                          **copy.deepcopy(options))


# --- (a) every method family once on the testbed ----------------------------------------------------
def check_families(ctx: CheckContext) -> list[Row]:
    ids = ctx.testbed.calibration(*ctx.sizes.family_tokens)
    return [measure(f"a: {family}", ctx.device, lambda family=family: family_on_testbed(ctx, family, ids))
            for family in ctx.families]


def family_on_testbed(ctx: CheckContext, family: str, ids: torch.Tensor) -> str:
    """Prune the testbed on the device with one family; it must leave every parameter there and
    give finite logits."""
    model = ctx.testbed.model(ctx.device)
    try:
        report = prune(ctx, model, ids, METHOD_FAMILIES[family])
        devices = {p.device.type for p in model.parameters()}
        if devices != {ctx.device.type}:
            raise CheckFailed(f"parameters left on {sorted(devices)} after pruning on {ctx.device}")
        with torch.no_grad():
            logits = model(input_ids=ids[:1].to(ctx.device)).logits  # [1, T, V]
        if not torch.isfinite(logits).all():
            raise CheckFailed("the pruned model's logits are not finite")
        return family_summary(report)
    finally:
        del model
        free_device_memory(ctx.device)


def family_summary(report: dict) -> str:
    """'sparsity 0.500', 'removed layers [7]', 'parameters 0.81 of dense': what the family did."""
    parts = [f"sparsity {report['sparsity']['overall']:.3f}"]
    if removed := report["pruning"].get("removed_layers"):
        parts.append(f"removed layers {removed}")
    dense, pruned = report["parameters"]["dense"]["total"], report["parameters"]["pruned"]["total"]
    if pruned != dense:
        parts.append(f"parameters {pruned / dense:.3f} of dense")
    return ", ".join(parts)


# --- (b) the device against the CPU, same calibration ----------------------------------------------
def check_device_agreement(ctx: CheckContext) -> list[Row]:
    ids = ctx.testbed.calibration(*ctx.sizes.compare_tokens)
    return [measure(f"b: {family}, {ctx.device.type} vs cpu", ctx.device,
                    lambda family=family: device_agrees_with_cpu(ctx, family, ids))
            for family in AGREEMENT_FAMILIES]


def pruned_testbed(ctx: CheckContext, device: torch.device, options: dict, ids: torch.Tensor,
                   dtype: torch.dtype = torch.float32) -> tuple[dict[str, torch.Tensor], float]:
    """(decoder masks, perplexity) of the testbed pruned on `device` in `dtype`."""
    model = ctx.testbed.model(device, dtype)
    try:
        prune(ctx, model, ids, options)
        return decoder_masks(model), ctx.testbed.perplexity(model)
    finally:
        del model
        free_device_memory(device)


def device_agrees_with_cpu(ctx: CheckContext, family: str, ids: torch.Tensor) -> str:
    options = METHOD_FAMILIES[family]
    masks, ppl = pruned_testbed(ctx, ctx.device, options, ids)
    cpu_masks, cpu_ppl = pruned_testbed(ctx, torch.device("cpu"), options, ids)
    differ, total = differing_entries(masks, cpu_masks)
    change = relative(ppl, cpu_ppl)
    words = (f"{mask_summary(differ, total)}; ppl cpu {cpu_ppl:.4f}, {ctx.device.type} {ppl:.4f} "
             f"({100 * change:+.3f}%)")
    if not ctx.on_gpu:
        words = f"cpu vs cpu (no CUDA device: a repeatability check, not a device comparison): {words}"
    if differ > MASK_TOLERANCE * total or abs(change) > PPL_TOLERANCE:
        raise CheckFailed(f"{words}; allowed: {100 * MASK_TOLERANCE:g}% of mask entries, "
                          f"{100 * PPL_TOLERANCE:g}% perplexity")
    return words


# --- (e) bfloat16 against float32 -------------------------------------------------------------------
def check_bfloat16(ctx: CheckContext) -> list[Row]:
    ids = ctx.testbed.calibration(*ctx.sizes.compare_tokens)
    return [measure(f"e: wanda, bfloat16 vs float32 on {ctx.device.type}", ctx.device,
                    lambda: bfloat16_agrees_with_float32(ctx, ids))]


def bfloat16_agrees_with_float32(ctx: CheckContext, ids: torch.Tensor) -> str:
    options = METHOD_FAMILIES["wanda"]
    masks, ppl = pruned_testbed(ctx, ctx.device, options, ids, torch.float32)
    half_masks, half_ppl = pruned_testbed(ctx, ctx.device, options, ids, torch.bfloat16)
    differ, total = differing_entries(masks, half_masks)
    change = relative(half_ppl, ppl)
    words = f"{mask_summary(differ, total)}; ppl float32 {ppl:.4f}, bfloat16 {half_ppl:.4f} ({100 * change:+.2f}%)"
    if abs(change) > BF16_PPL_TOLERANCE:
        raise CheckFailed(f"{words}; allowed: {100 * BF16_PPL_TOLERANCE:g}% perplexity")
    return words


# --- (f) the papers' protocol on the 7B shape -------------------------------------------------------
def check_paper_protocol(ctx: CheckContext) -> list[Row]:
    shape = ctx.shape("llama2_7b")
    nsamples, seqlen = ctx.sizes.paper_tokens
    return [measure(f"f: {method}, {shape.name}, {nsamples} x {seqlen} tokens", ctx.device,
                    lambda method=method: paper_protocol_run(ctx, shape, method, nsamples, seqlen))
            for method in PAPER_METHODS]


def paper_protocol_run(ctx: CheckContext, shape, method: str, nsamples: int, seqlen: int) -> str:
    """Build the random model on the device, prune it at 50% with `method`'s defaults: the row's
    seconds include the build; the detail says the prune stage's own time."""
    config = shape.config()
    ids = random_ids(config.vocab_size, nsamples, seqlen)
    model = random_model(config, ctx.device, ctx.shape_dtype)
    try:
        synchronize(ctx.device)
        start = time.perf_counter()
        report = prune(ctx, model, ids, {"method": method, "sparsity": 0.5})
        synchronize(ctx.device)  # the prune time is the device's, not the launches'
        seconds = time.perf_counter() - start
    finally:
        del model
        free_device_memory(ctx.device)
    stages = ", ".join(f"{stage} {value:.1f} s" for stage, value in report["timings"].items() if stage != "total")
    dtype = str(ctx.shape_dtype).removeprefix("torch.")
    return (f"{shape.describe()}, {dtype}: pruned in {seconds:.1f} s ({stages}); "
            f"sparsity {report['sparsity']['overall']:.3f}")
