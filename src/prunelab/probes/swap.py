"""Swap-KL probes: are layers i and j interchangeable, or can one replace the other?

"No Free Swap" (seed method). p_M is the dense model's next-token distribution on unlabelled text.
- Replacement i <- j: slot i runs layer j's weights (layer j stays at j).
  d_repl(i, j) = reduce over the two directions (i <- j, j <- i) of E_x KL(p_M || p_{i<-j});
  `reduce: max` (the paper's definition), `mean` (one of its scripts) or `forward` (i <- j only).
- Interchange i <-> j: the two layers swap positions. d_int(i, j) = E_x KL(p_M || p_{i<->j}).
KL is averaged over tokens (`positions: all`) or taken at the last position (`positions: last`),
for all pairs with 0 < j - i <= max_distance.

Efficiency: every probed sequence agrees with the dense model before its first changed slot, so
the dense hidden state entering that slot is computed once per batch and reused by every variant
that starts there; only the suffix is run. `ProbeCost` counts layer calls against the naive cost
(one full forward pass per variant): about 0.55 for 16 layers and distance 3, since a variant
still runs every layer after its first changed slot. The variants that start at the same slot
(at most 3 x max_distance) run their suffixes together, slot by slot, so that each layer a slot
needs is brought into memory once for all of them: on a streamed model (`model.streaming`) one
decoder layer is read at a time, about L^2 / 2 reads a batch. Memory: the L + 1 dense states of
one batch (spilled to disk with the streamed model's activations) and one state per variant of
the slot being probed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from prunelab.calibration.runner import LayerInputs, move_to
from prunelab.models.adapter import ModelAdapter

log = logging.getLogger(__name__)

REDUCTIONS = ("max", "mean", "forward")
POSITIONS = ("all", "last")


def token_kl(ref_logprobs: torch.Tensor, logprobs: torch.Tensor, positions: str = "all",
             ref_probs: torch.Tensor | None = None) -> torch.Tensor:
    """KL(p_ref || p) per sequence: mean over tokens or at the last position.

    Args:
        ref_logprobs, logprobs: [B, T, V] log-probabilities.
        ref_probs: ref_logprobs.exp(), when the caller reuses it over many variants.
    Returns:
        [B] KL divergences.
    """
    ref_probs = ref_logprobs.exp() if ref_probs is None else ref_probs
    kl = (ref_probs * (ref_logprobs - logprobs)).sum(-1)  # [B, T]
    return kl[:, -1] if positions == "last" else kl.mean(dim=1)


def interchange_order(num_layers: int, i: int, j: int) -> list[int]:
    """Layer order with positions i and j swapped."""
    order = list(range(num_layers))
    order[i], order[j] = order[j], order[i]
    return order


def replacement_order(num_layers: int, slot: int, source: int) -> list[int]:
    """Layer order where `slot` runs layer `source`'s weights."""
    order = list(range(num_layers))
    order[slot] = source
    return order


def probe_pairs(num_layers: int, max_distance: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(num_layers) for j in range(i + 1, min(num_layers, i + max_distance + 1))]


@dataclass
class ProbeCost:
    """Decoder-layer calls made, against the naive one full pass per probed variant."""

    layer_calls: int = 0
    naive_layer_calls: int = 0

    @property
    def ratio(self) -> float:
        return self.layer_calls / max(self.naive_layer_calls, 1)


@dataclass
class SwapProbeResult:
    """Matrices are [L, L] with NaN outside the probed pairs; `gap` = d_repl - d_int per pair."""

    replacement: torch.Tensor  # [L, L], symmetric after reduction
    replacement_directed: torch.Tensor  # [L, L]: entry (slot, source)
    interchange: torch.Tensor  # [L, L], symmetric
    pairs: list[tuple[int, int]]
    cost: ProbeCost = field(default_factory=ProbeCost)

    def gap(self) -> torch.Tensor:
        return torch.tensor([self.replacement[i, j] - self.interchange[i, j] for i, j in self.pairs])

    def to_tensors(self) -> dict:
        """Lossless form for the calibration cache (tensors, pairs, call counts)."""
        return {"replacement": self.replacement, "replacement_directed": self.replacement_directed,
                "interchange": self.interchange, "pairs": [list(p) for p in self.pairs],
                "cost": [self.cost.layer_calls, self.cost.naive_layer_calls]}

    @classmethod
    def from_tensors(cls, value: dict) -> "SwapProbeResult":
        return cls(value["replacement"], value["replacement_directed"], value["interchange"],
                   [tuple(p) for p in value["pairs"]], ProbeCost(*value["cost"]))

    def to_dict(self) -> dict:
        def matrix(m: torch.Tensor) -> list[list[float | None]]:
            return [[None if torch.isnan(v) else float(v) for v in row] for row in m]

        return {"replacement": matrix(self.replacement), "interchange": matrix(self.interchange),
                "replacement_directed": matrix(self.replacement_directed), "pairs": self.pairs,
                "gap": self.gap().tolist(), "mean_gap": float(self.gap().mean()) if self.pairs else None,
                "cost": {"layer_calls": self.cost.layer_calls, "naive_layer_calls": self.cost.naive_layer_calls,
                         "ratio": self.cost.ratio}}


class SwapProbe:
    """Replacement and interchange KL for all pairs within `max_distance`, prefix states reused."""

    def __init__(self, adapter: ModelAdapter, max_distance: int = 3, reduce: str = "max",
                 positions: str = "all", device: torch.device | None = None, progress: bool = True):
        if reduce not in REDUCTIONS or positions not in POSITIONS:
            raise ValueError(f"reduce must be one of {REDUCTIONS}, positions one of {POSITIONS}")
        self.adapter = adapter
        self.max_distance = max_distance
        self.reduce = reduce
        self.positions = positions
        self.device = device or (adapter.store.device if adapter.streamed
                                 else next(adapter.model.parameters()).device)
        self.progress = progress

    @torch.no_grad()
    def run(self, inputs: LayerInputs) -> SwapProbeResult:
        """inputs: layer-0 inputs of the calibration batches (`capture_layer_inputs`)."""
        n = self.adapter.num_layers
        pairs = probe_pairs(n, self.max_distance)
        # variants keyed by (kind, a, b): interchange (i, j); replacement (slot, source)
        variants = [("int", i, j) for i, j in pairs] + [("rep", i, j) for i, j in pairs] + \
                   [("rep", j, i) for i, j in pairs]
        orders = {v: interchange_order(n, v[1], v[2]) if v[0] == "int" else replacement_order(n, v[1], v[2])
                  for v in variants}
        starting: dict[int, list[tuple[str, int, int]]] = {}  # first changed slot -> its variants
        for kind, a, b in variants:
            starting.setdefault(min(a, b) if kind == "int" else a, []).append((kind, a, b))
        keep = self.adapter.store.keep_activation if self.adapter.streamed else (lambda t: t)
        totals = {v: 0.0 for v in variants}
        count = 0
        cost = ProbeCost()
        batches = list(zip(inputs.hidden, inputs.kwargs))
        for hidden0, kwargs in tqdm(batches, desc="swap probe", disable=not self.progress, leave=False):
            kwargs = move_to(kwargs, self.device)
            states = [hidden0.to(self.device)]  # states[s]: dense hidden state entering slot s
            for _, layer in self.adapter.layers_in_memory():
                states.append(keep(self.adapter.call_layer(layer, states[-1], kwargs)))
            cost.layer_calls += n
            dense = F.log_softmax(self.adapter.logits_from_hidden(states[-1]).float(), dim=-1)
            dense_probs = dense.exp()  # [B, T, V], shared by every variant
            for first, group in tqdm(sorted(starting.items()), desc="swap probe: variants by first slot",
                                     disable=not self.progress, leave=False):
                hidden = self._run_suffixes(group, orders, first, states[first], kwargs, cost)
                with self.adapter.outside_in_memory("head"):
                    for variant in group:
                        logprobs = F.log_softmax(self.adapter.logits_from_hidden(hidden.pop(variant)).float(),
                                                 dim=-1)  # [B, T, V]
                        kl = token_kl(dense, logprobs, self.positions, ref_probs=dense_probs)  # [B]
                        totals[variant] += float(kl.sum())
            count += hidden0.shape[0]
            cost.naive_layer_calls += n * (1 + len(variants))
        return self._assemble(n, pairs, {k: v / count for k, v in totals.items()}, cost)

    def _run_suffixes(self, group: list, orders: dict, first: int, entering: torch.Tensor, kwargs: dict,
                      cost: ProbeCost) -> dict:
        """The hidden states after the last layer of the variants in `group`, which all leave the
        dense order at slot `first` (and so start from the dense state `entering` it): slot by
        slot, each layer needed at a slot in memory once for every variant that runs it there."""
        hidden = {variant: entering for variant in group}
        for slot in range(first, len(orders[group[0]])):
            for index in sorted({orders[variant][slot] for variant in group}):
                with self.adapter.layer_in_memory(index) as layer:
                    for variant in group:
                        if orders[variant][slot] == index:
                            hidden[variant] = self.adapter.call_layer(layer, hidden[variant], kwargs)
                            cost.layer_calls += 1
        return hidden

    def _assemble(self, n: int, pairs: list[tuple[int, int]], mean_kl: dict, cost: ProbeCost) -> SwapProbeResult:
        nan = float("nan")
        interchange = torch.full((n, n), nan)
        directed = torch.full((n, n), nan)
        replacement = torch.full((n, n), nan)
        for i, j in pairs:
            interchange[i, j] = interchange[j, i] = mean_kl[("int", i, j)]
            directed[i, j], directed[j, i] = mean_kl[("rep", i, j)], mean_kl[("rep", j, i)]
            both = torch.tensor([directed[i, j], directed[j, i]])
            value = {"max": both.max(), "mean": both.mean(), "forward": both[0]}[self.reduce]
            replacement[i, j] = replacement[j, i] = value
        return SwapProbeResult(replacement, directed, interchange, pairs, cost)


def layer_scores(distance: torch.Tensor) -> list[float]:
    """s(i) = min over probed partners j of d(i, j): low = a layer something else can stand in for."""
    scores = []
    for row in distance:
        finite = row[~torch.isnan(row)]
        scores.append(float(finite.min()) if finite.numel() else float("inf"))
    return scores
