"""Loss gradients of chosen weights on calibration text (gradient allocation, Taylor scoring).

`squared_weight_gradients` is the pass behind gradient allocation: one sequence per backward pass,
which keeps the statistic independent of the calibration batch size. Only the weights asked for get
gradients, so the backward pass stores nothing else; every
parameter's `requires_grad` and `.grad` are restored afterwards, even when the pass fails.

`backward_through` is the one loop both gradient methods use: the whole model's backward batch by
batch (`backward_whole_model`), or, for a streamed model (`models.streaming`), which cannot hold the
whole graph, `backward_by_layer`: the forward pass one decoder layer at a time keeping every
layer's input (h_0..h_L, spilled to disk beyond the activation budget), dL/dh_L at the head, then
the layers last to first, each read once: it recomputes the layer's forward from its stored input
with grad on, and back-propagates dL/dh_{l+1} into the layer's weights and dL/dh_l. Per layer these
are the operations of the whole-model backward on the same tensors, so the gradients are the same.

Half precision (the mixed-precision training practice of Micikevicius et al., "Mixed Precision
Training", ICLR 2018): the backward runs in the model's dtype, but what the methods read is made
safe for it.
- float16 has 5 exponent bits: a gradient below 2^-24 (about 6e-8) flushes to zero, which a loss
  gradient of a large model's weight easily is. The loss is multiplied by a power of two before the
  backward (`LossScale`, from 2^16) and the gradients are divided by it in float32, where that is
  exact; when a gradient overflows to inf or nan the scale is halved and the batch run again
  (`backward_until_finite`).
- bfloat16 has float32's exponent range, so nothing flushes and the scale stays 1; but its 8-bit
  mantissa makes a running sum of gradients drift (`.grad` accumulates in the weight's dtype):
  every sum over batches is kept in float32 (`GradientSums`), every per-batch reduction in
  float64 (`squared_weight_gradients`).
- float32 is untouched: scale 1, no check, and the sums are autograd's own `.grad` accumulation
  (the first batch's gradient, then the next ones added in place), so the methods stay bit for bit
  what their float32 references compute.
Each batch's gradient itself is computed in the model's dtype, as the references do it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from prunelab.calibration.runner import batched, capture_layer_inputs, move_to
from prunelab.models.adapter import ModelAdapter

INITIAL_LOSS_SCALE = 2.0 ** 16  # where dynamic loss scaling starts (torch.amp.GradScaler's default too)
SMALLEST_LOSS_SCALE = 1.0  # still inf or nan at 1: the float16 forward overflowed, no scale helps

# visit(layer index, its weights, their float32 loss gradients, unscaled)
Visit = Callable[[int, list[torch.Tensor], list[torch.Tensor]], None]


# --- loss scaling: pure arithmetic ---------------------------------------------------------------
@dataclass
class LossScale:
    """The power of two a backward multiplies its loss by, and whether it adapts.

    Dynamic (float16): starts at 2^16 and halves after each backward whose gradients overflow, for
    the rest of the pass (it never grows back: a pass is short, and any scale that does not
    overflow recovers the same gradients up to float16's own rounding). Static (float32, bfloat16):
    1, never checked, so those backward passes are exactly the unscaled ones.
    """

    value: float = 1.0
    dynamic: bool = False

    @classmethod
    def for_dtype(cls, dtype: torch.dtype) -> LossScale:
        """Dynamic from 2^16 for float16 (5 exponent bits: small gradients flush to zero), static
        1 otherwise (bfloat16 shares float32's exponent range)."""
        return cls(INITIAL_LOSS_SCALE, dynamic=True) if dtype == torch.float16 else cls()

    def halve(self) -> None:
        if self.value / 2 < SMALLEST_LOSS_SCALE:
            raise FloatingPointError("the loss gradients are inf or nan at every loss scale down to "
                                     f"{SMALLEST_LOSS_SCALE:g}: the float16 model overflows by itself; "
                                     "run it in bfloat16 or float32")
        self.value /= 2


def scale_loss(loss: torch.Tensor, scale: float) -> torch.Tensor:
    """loss x scale; the loss itself at scale 1 (no extra node: float32 stays bit-identical)."""
    return loss if scale == 1.0 else loss * scale


def unscale(grad: torch.Tensor, scale: float) -> torch.Tensor:
    """A gradient of scale x the loss as the gradient of the loss, in float32.

    Exact for a power-of-two scale: float16's and bfloat16's values divided by 2^16 stay inside
    float32's range and precision. At scale 1 a float32 gradient is returned as is (no copy).
    """
    grad = grad.float()
    return grad if scale == 1.0 else grad / scale


def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """True when no entry of any tensor is inf or nan (one device synchronisation)."""
    checks = [torch.isfinite(t).all() for t in tensors]
    return bool(torch.stack(checks).all()) if checks else True


# --- one backward, run again until finite --------------------------------------------------------
def backward_until_finite(backward: Callable[[float], None], leaves: Sequence[torch.Tensor],
                          scale: LossScale) -> float:
    """Run `backward(s)`, which back-propagates s x the loss into the leaves' `.grad` (cleared here
    before each run); with a dynamic scale, while any leaf's gradient holds inf or nan, halve the
    scale and run it again. Returns the scale the leaves' gradients carry."""
    while True:
        for leaf in leaves:
            leaf.grad = None
        backward(scale.value)
        if not scale.dynamic or all_finite(leaf.grad for leaf in leaves if leaf.grad is not None):
            return scale.value
        scale.halve()


def take_gradients(weights: Sequence[torch.Tensor], scale: float) -> list[torch.Tensor]:
    """The weights' gradients, unscaled into float32 (`unscale`), and their `.grad` cleared."""
    grads = [unscale(w.grad, scale) for w in weights]
    for w in weights:
        w.grad = None
    return grads


class GradientSums:
    """Float32 sums over batches of the loss gradients of `weights`, added in batch order.

    A static scale (float32, bfloat16): inside `collecting()`, a hook moves each weight's gradient
    into its sum as soon as autograd has it (`Tensor.register_post_accumulate_grad_hook`), so no
    second set of gradients is ever held. In float32 the first batch's gradient becomes the sum and
    the later ones are added to it in place: autograd's own `.grad` accumulation, bit for bit.
    A dynamic scale (float16): a batch's gradients stay in `.grad` until the batch's backward is
    known to be finite (`backward_until_finite`); `add_batch` then unscales them into the sums.
    Memory: one float32 value per weight (float16 also holds the batch's `.grad` meanwhile).
    """

    def __init__(self, weights: Sequence[torch.Tensor], scale: LossScale):
        self.weights = list(weights)
        self.dynamic = scale.dynamic
        self.sums: list[torch.Tensor | None] = [None] * len(self.weights)

    @contextmanager
    def collecting(self) -> Iterator[None]:
        """Hooks on the weights (which must require grad) that take each gradient, static scale."""
        handles = [] if self.dynamic else [w.register_post_accumulate_grad_hook(partial(self._take, i))
                                           for i, w in enumerate(self.weights)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def add_batch(self, scale: float) -> None:
        """After a batch's finite backward (dynamic scale): its gradients, carrying `scale`, into
        the sums. Nothing to do for a static scale: the hooks took them."""
        if self.dynamic:
            for i, w in enumerate(self.weights):
                self._add(i, w.grad, scale)
                w.grad = None

    def values(self) -> list[torch.Tensor]:
        """The sums, one float32 tensor of each weight's shape."""
        return list(self.sums)

    def _take(self, index: int, weight: torch.Tensor) -> None:
        self._add(index, weight.grad, 1.0)
        weight.grad = None

    def _add(self, index: int, grad: torch.Tensor, scale: float) -> None:
        grad = unscale(grad, scale)
        total = self.sums[index]
        self.sums[index] = grad if total is None else total.add_(grad)


# --- the calibration loss and the backward loops -------------------------------------------------
@contextmanager
def gradients_for(model: nn.Module, weights: Iterable[torch.Tensor]) -> Iterator[None]:
    """Inside, only `weights` require grad (with grad mode on); on exit every parameter's flag is
    restored and every gradient cleared."""
    saved = {p: p.requires_grad for p in model.parameters()}
    weights = list(weights)
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        for w in weights:
            w.requires_grad_(True)
            w.grad = None
        with torch.enable_grad():
            yield
    finally:
        for p, flag in saved.items():
            p.requires_grad_(flag)
            p.grad = None


def next_token_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ids [B, T] (the calibration LM loss), computed in fp32."""
    return loss_from_logits(model(input_ids=ids, use_cache=False).logits, ids)


def loss_from_logits(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in fp32 of logits [B, T, V] for ids [B, T]."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten().to(logits.device))


def squared_weight_gradients(adapter: ModelAdapter, samples: torch.Tensor, progress: bool = True) -> torch.Tensor:
    """[L] sum over sequences of the squared loss gradients of each decoder layer's linear weights.

    samples: [N, T] token ids, back-propagated one sequence at a time. Each sequence's squares are
    summed in float64 from its float32-unscaled gradients.
    """
    total = torch.zeros(adapter.num_layers, dtype=torch.float64)  # [L]

    def add(index: int, weights: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        for g in grads:
            total[index] += float(g.double().pow(2).sum())

    backward_through(adapter, samples, 1, adapter.linear_weights, add, per_batch=True, progress=progress,
                     desc="gradient")
    return total


def backward_through(adapter: ModelAdapter, samples: torch.Tensor, batch_size: int,
                     weights_of: Callable[[nn.Module], list[torch.Tensor]], visit: Visit,
                     per_batch: bool = False, progress: bool = True, desc: str = "backward") -> None:
    """The calibration LM loss of samples [N, T], in batches of `batch_size`, back-propagated into
    the weights `weights_of(layer)` names in each decoder layer; `visit(index, weights, grads)` gets
    their float32 loss gradients (unscaled): after each batch (`per_batch`) or once, summed over
    the batches in order. The whole model's backward when resident, one layer at a time when
    streamed (`backward_by_layer`); the same gradients either way."""
    loop = backward_by_layer if adapter.streamed else backward_whole_model
    loop(adapter, samples, batch_size, weights_of, visit, per_batch=per_batch, progress=progress,
         desc=f"{desc}: {'streamed' if adapter.streamed else 'dense'} backward")


def backward_whole_model(adapter: ModelAdapter, samples: torch.Tensor, batch_size: int,
                         weights_of: Callable[[nn.Module], list[torch.Tensor]], visit: Visit,
                         per_batch: bool = False, progress: bool = True,
                         desc: str = "dense backward") -> None:
    """`backward_through` on a resident model: one forward and backward of the whole model per batch.

    Memory: the graph of one batch, the gradients of the weights asked for (float32 sums of them
    when summing over batches: `GradientSums`).
    """
    model = adapter.model
    groups = [weights_of(layer) for layer in adapter.layers]
    weights = [w for group in groups for w in group]
    scale = LossScale.for_dtype(weights[0].dtype)
    sums = GradientSums(weights, scale)
    device = model.get_input_embeddings().weight.device
    batches = batched(samples, batch_size)
    with gradients_for(model, weights), (nullcontext() if per_batch else sums.collecting()):
        for ids in tqdm(batches, desc=desc, disable=not progress, leave=False):
            carried = backward_until_finite(partial(_model_backward, model, ids.to(device)), weights, scale)
            if per_batch:
                _visit_groups(visit, groups, take_gradients(weights, carried))
            else:
                sums.add_batch(carried)
        if not per_batch:
            _visit_groups(visit, groups, sums.values())


def _model_backward(model: nn.Module, ids: torch.Tensor, scale: float) -> None:
    """scale x the calibration loss of ids [B, T] back-propagated through the whole model."""
    scale_loss(next_token_loss(model, ids), scale).backward()


def _visit_groups(visit: Visit, groups: list[list[torch.Tensor]], grads: list[torch.Tensor]) -> None:
    """visit(index, group, its gradients) for each layer's group, grads flat in the groups' order."""
    flat = iter(grads)
    for index, group in enumerate(groups):
        visit(index, group, [next(flat) for _ in group])


def backward_by_layer(adapter: ModelAdapter, samples: torch.Tensor, batch_size: int,
                      weights_of: Callable[[nn.Module], list[torch.Tensor]], visit: Visit,
                      per_batch: bool = False, progress: bool = True,
                      desc: str = "streamed backward") -> None:
    """`backward_through` on a streamed model, one layer in memory.

    samples: [N, T] token ids in batches of `batch_size`. For each decoder layer (last to first),
    `weights_of(layer)` names the weights that get gradients, and `visit(index, weights, grads)`
    gets their float32 gradients: after each batch's backward (`per_batch`) or once, summed over
    the batches in order (as `.grad` accumulates in a whole-model loop).
    Loss scaling (float16): each batch's dL/dh carries its own scale from the head down; a layer
    whose backward overflows halves it (the incoming gradient halved, exactly) and runs again,
    so the layers above keep the larger scale they did not overflow at.
    Memory: the L + 1 layer inputs and two sets of dL/dh, all batches (the store spills them to
    disk beyond its activation budget), one layer's weights and gradients, one batch's graph.
    """
    store = adapter.store
    inputs = capture_layer_inputs(adapter, samples, batch_size)
    state_bytes = sum(h.numel() * h.element_size() for h in inputs.hidden)
    with store.spilling_beyond_budget((adapter.num_layers + 3) * state_bytes):
        keep = store.keep_activation
        kwargs = [move_to(kw, store.device) for kw in inputs.kwargs]
        states = [inputs.hidden]  # states[l][b]: h_l of batch b, [B, T, C]
        with torch.no_grad():
            for _, layer in tqdm(adapter.layers_in_memory(), total=adapter.num_layers, desc=f"{desc}: forward",
                                 disable=not progress, leave=False):
                states.append([keep(adapter.call_layer(layer, h.to(store.device), kw))
                               for h, kw in zip(states[-1], kwargs)])
        head_scale = LossScale.for_dtype(inputs.hidden[0].dtype)
        grads, scales = [], []  # per batch: scale x dL/dh_{l+1} [B, T, C] (model dtype), and that scale
        with torch.enable_grad(), adapter.outside_in_memory("head"):
            for h, ids in zip(states.pop(), batched(samples, batch_size)):
                h = h.detach().to(store.device).requires_grad_()
                run = partial(_head_backward, adapter, h, ids)
                scales.append(backward_until_finite(run, [h], head_scale))
                grads.append(keep(h.grad))
        for index in tqdm(reversed(range(adapter.num_layers)), total=adapter.num_layers,
                          desc=f"{desc}: backward", disable=not progress, leave=False):
            with adapter.layer_in_memory(index) as layer:
                weights = weights_of(layer)
                sums = GradientSums(weights, head_scale)
                with gradients_for(layer, weights), (nullcontext() if per_batch else sums.collecting()):
                    below = []
                    for b, (h, kw) in enumerate(zip(states.pop(), kwargs)):
                        h = h.detach().to(store.device).requires_grad_(index > 0)  # dL/dh_0 unused
                        leaves = weights + [h] if index > 0 else weights
                        run = partial(_layer_backward, adapter, layer, h, kw, grads[b], scales[b])
                        scale = LossScale(scales[b], head_scale.dynamic)
                        scales[b] = backward_until_finite(run, leaves, scale)
                        if index > 0:
                            below.append(keep(h.grad))
                        if per_batch:
                            visit(index, weights, take_gradients(weights, scales[b]))
                        else:
                            sums.add_batch(scales[b])
                    if not per_batch:
                        visit(index, weights, sums.values())
                grads = below


def _head_backward(adapter: ModelAdapter, h: torch.Tensor, ids: torch.Tensor, scale: float) -> None:
    """scale x the calibration loss of the last hidden state h [B, T, C] back-propagated into h."""
    scale_loss(loss_from_logits(adapter.logits_from_hidden(h), ids), scale).backward()


def _layer_backward(adapter: ModelAdapter, layer: nn.Module, h: torch.Tensor, layer_kwargs: dict,
                    grad: torch.Tensor, carried: float, scale: float) -> None:
    """One decoder layer's backward from its input h [B, T, C]: `grad` is carried x dL/dh_{l+1};
    it is sent in as scale x dL/dh_{l+1} (a power-of-two rescale, exact)."""
    grad = grad.to(h.device)
    grad = grad if scale == carried else grad * (scale / carried)
    adapter.call_layer(layer, h, layer_kwargs).backward(grad)
