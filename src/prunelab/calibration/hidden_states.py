"""Hidden states for depth pruning and its recovery, gathered through the layer-sequential runner.

h_l is the state entering decoder layer l; h_L is the state after the last layer and BEFORE the
final norm (unlike the last entry of transformers' `output_hidden_states`, which is normed). Only the
states a consumer keeps stay alive: the runner holds one layer's inputs and outputs at a time.
Calibration windows are unpadded [N, T] token ids, so "non-padded tokens" means every position.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from prunelab.calibration.passes import batch_logits, layer_pass
from prunelab.calibration.runner import batched
from prunelab.models.adapter import ModelAdapter
from prunelab.scoring.layers import RunningMean, nll_from_logits


def iter_hidden_states(adapter: ModelAdapter, samples: torch.Tensor, batch_size: int = 1,
                       progress: bool = True, desc: str = "hidden states",
                       ) -> Iterator[tuple[int, list[torch.Tensor]]]:
    """Yield (l, h_l) for l = 0..L; h_l is a list of per-batch [B, T, C] tensors."""
    runner = layer_pass(adapter, samples, batch_size, "dense", progress, desc)
    for step in runner:
        yield step.index, step.inputs.hidden
    yield adapter.num_layers, runner.outputs.hidden


def iter_state_pairs(states: Iterator[tuple[int, list[torch.Tensor]]], distance: int
                     ) -> Iterator[tuple[int, list[torch.Tensor], list[torch.Tensor]]]:
    """Yield (l, h_l, h_{l+distance}) for every l with l + distance <= L, keeping distance + 1 states."""
    window: deque[tuple[int, list[torch.Tensor]]] = deque(maxlen=distance + 1)
    for index, hidden in states:
        window.append((index, hidden))
        if len(window) == distance + 1:
            first_index, first = window[0]
            yield first_index, first, hidden


def block_term_means(adapter: ModelAdapter, samples: torch.Tensor, distance: int,
                     term: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], batch_size: int = 1,
                     progress: bool = True, desc: str = "hidden states",
                     keep: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[float | None]:
    """[L] per start l: the mean over all calibration values of term(h_l, h_{l+distance}) (term maps
    two [B, T, C] batches to per-token values); None where l + distance > L. `keep` reduces every
    state before it is held (e.g. to the last token), so only what the term reads stays alive."""
    means: list[float | None] = [None] * adapter.num_layers
    states = iter_hidden_states(adapter, samples, batch_size, progress, desc=desc)
    if keep is not None:
        states = ((index, [keep(h) for h in hidden]) for index, hidden in states)
    for start, h_in, h_out in iter_state_pairs(states, distance):
        mean = RunningMean()
        for a, b in zip(h_in, h_out):  # [B, T, C] each
            mean.update(term(a, b))
        means[start] = mean.value
    return means


@torch.no_grad()
def calibration_nll(adapter: ModelAdapter, samples: torch.Tensor, batch_size: int = 1,
                    layers: Sequence[torch.nn.Module] | None = None) -> float:
    """Mean next-token NLL of the calibration windows, optionally with another layer list.

    samples: [N, T] token ids. `layers` runs the model with that decoder-layer list (a candidate
    removal) through `adapter.layers_replaced`; the model is restored afterwards. The forward pass
    is `batch_logits`: on a streamed model, one pass over the candidate's layers, each read once.
    """
    total, count = 0.0, 0

    def run() -> None:
        nonlocal total, count
        for batch, logits in batch_logits(adapter.model, samples, batch_size, progress=False):  # [B, T, V]
            nll, n = nll_from_logits(logits, batch)
            total, count = total + nll, count + n

    if layers is None:
        run()
    else:
        with adapter.layers_replaced(layers):
            run()
    return total / max(count, 1)


@torch.no_grad()
def removal_nlls(adapter: ModelAdapter, samples: torch.Tensor, layers: Sequence[torch.nn.Module],
                 positions: Sequence[int], batch_size: int = 1, progress: bool = False,
                 desc: str = "removals") -> dict[int, float]:
    """{k: calibration NLL of the model running `layers` without layers[k]} for each k in positions.

    Equals `calibration_nll(adapter, samples, batch_size, layers=<layers without layers[k]>)` for
    every k, to the bit: the model without layers[k] receives, at layers[k + 1], the state that
    `layers` gives at layers[k]'s input, so one pass over `layers` serves every candidate's prefix
    and only the suffix after k and the head run per candidate (about half of SLEB's layer calls).
    The same batches run the same layer calls with the same keyword arguments as the full forward.
    A streamed model, or one placed by accelerate (`adapter.dispatched`: its layers may sit on
    other devices), runs each candidate's full forward instead.
    """
    wanted = sorted(set(positions))
    if not wanted:
        return {}
    if adapter.streamed or adapter.dispatched:
        return {k: calibration_nll(adapter, samples, batch_size, [m for j, m in enumerate(layers) if j != k])
                for k in progress_bar(wanted, progress, desc)}
    nll: dict[int, float] = {}
    with adapter.layers_replaced(layers):
        for step in layer_pass(adapter, samples, batch_size, "dense", progress, desc, layers=wanted):
            total, count = 0.0, 0
            for batch, hidden, kwargs in zip(batched(samples, batch_size), step.inputs.hidden, step.inputs.kwargs):
                for layer in layers[step.index + 1:]:  # hidden: [B, T, C], the state entering layers[k]
                    hidden = ModelAdapter.call_layer(layer, hidden, kwargs)
                part, n = nll_from_logits(adapter.logits_from_hidden(hidden), batch)  # logits [B, T, V]
                total, count = total + part, count + n
            nll[step.index] = total / max(count, 1)
    return nll


@dataclass
class BoundaryBatch:
    """The dense model's states around one removed block [s, e), for one calibration batch."""

    x_pre: torch.Tensor  # [B, T, C] h_s: input of the first removed layer
    x_post: torch.Tensor  # [B, T, C] h_e: input of the first surviving layer (or pre-norm output)
    mlp_out: torch.Tensor | None = None  # [B, T, C] MLP output of layer s - 1 (ReplaceMe)


def boundary_activations(adapter: ModelAdapter, samples: torch.Tensor,
                         boundaries: Sequence[tuple[int, int]], batch_size: int = 1,
                         mlp_outputs: bool = False, progress: bool = True,
                         ) -> Iterator[tuple[int, list[BoundaryBatch]]]:
    """Yield (k, batches) for each boundary k = (s, e), as soon as layer e's input is known.

    Runs the model as it currently is (call inside `adapter.layers_replaced(dense_layers)` to get
    the unpruned model's states). With `mlp_outputs`, also captures the output of layer s - 1's
    MLP output projection (s >= 1), reshaped to [B, T, C].
    """
    if not boundaries:
        return
    if mlp_outputs and any(s < 1 for s, _ in boundaries):
        raise ValueError("MLP outputs of layer s - 1 need s >= 1")
    starts: dict[int, list[torch.Tensor]] = {}  # h_s of boundaries still waiting for their h_e
    mlp: dict[int, list[torch.Tensor]] = {}  # MLP outputs of layer s - 1, same lifetime
    pending = set(range(len(boundaries)))

    def deliver(index: int, hidden: list[torch.Tensor]) -> Iterator[tuple[int, list[BoundaryBatch]]]:
        for k, (s, e) in enumerate(boundaries):
            if e == index:
                extra = mlp.get(s - 1) or [None] * len(hidden)
                yield k, [BoundaryBatch(a, b, m) for a, b, m in zip(starts[s], hidden, extra)]
                pending.discard(k)
        waiting = {boundaries[k][0] for k in pending}
        if index in waiting:
            starts[index] = hidden
        for s in [s for s in starts if s not in waiting]:  # free what no boundary needs any more
            del starts[s]
            mlp.pop(s - 1, None)

    last = max(e for _, e in boundaries)
    want_mlp = {s - 1 for s, _ in boundaries} if mlp_outputs else set()
    runner = layer_pass(adapter, samples, batch_size, "dense", progress, "boundary states",
                        layers=range(min(last, adapter.num_layers)))
    for step in runner:
        yield from deliver(step.index, step.inputs.hidden)
        if step.index in want_mlp:
            seen: list[torch.Tensor] = []
            writer = adapter.residual_writers(step.layer)[1]
            handle = writer.register_forward_hook(lambda _m, _a, out: seen.append(out.detach()))
            try:
                step.forward(keep_outputs=True)
            finally:
                handle.remove()
            mlp[step.index] = [m.reshape(h.shape).to(h.device)  # [B, T, C]
                               for m, h in zip(seen, step.inputs.hidden)]
    yield from deliver(last, runner.outputs.hidden)  # input of layer `last` (or h_L, pre-norm)


def progress_bar(items, progress: bool, desc: str):
    """tqdm over items, silent when progress bars are off (for loops outside the layer runner)."""
    return tqdm(items, desc=desc, disable=not progress, leave=False)
