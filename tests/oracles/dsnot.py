"""Oracle for DSnoT: prune-and-grow refinement of a Wanda (or per-row magnitude) mask.

Zhang, Zhao, Lin, Sun, Yao, Han, Tanner, Liu & Ji, "Dynamic Sparse No Training: Training-Free
Fine-tuning for Sparse LLMs", ICLR 2024 (zyxxmu/DSnoT, `prune_DSnoT`, its README command: initial
method wanda, 50% unstructured, 50 cycles, threshold 0.1, variance power 1; main.py's defaults:
the MLP linears are not refined, no sign test). Layer by layer, pruned outputs feeding the next:
1. per linear and calibration sample (X: [in, tokens]), running over samples: Wanda's ||X_j||^2,
   mu_j = the mean over samples of sum_t X_jt, and var_j = the token-weighted mean of each
   sample's population variance;
2. the initial mask: per row the int(in x s) lowest |W| ||X|| (or |W|), stable sort;
3. per output row, written here as a plain loop over rows and cycles: e = sum over pruned j of
   W_j mu_j; grow candidates are all columns sorted by W_j mu_j / var_j (0 for kept ones), taken
   from the top while e > 0, else from the bottom; prune candidates are the kept columns by
   ascending Wanda score, those with W_j mu_j < 0 in that order, then those > 0 in reverse (a
   column with W_j mu_j == 0 stands for the first kept column, as in the reference), taken from the
   front while e >= 0, else from the back. A cycle stops the row for good once |e| <= 0.1; while
   active it prunes the prune candidate, grows the grow candidate and moves e. The reference keeps
   cycling while any row of the matrix is active (at most 50 cycles), and in those cycles a stopped
   row's grow candidate is marked pruned and its prune candidate kept: reproduced in a second pass.
For testing prunelab's `pruning/refine=dsnot`; imports nothing from prunelab.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from oracles.llama_layers import layer_by_layer
from oracles.wanda import row_mask


class DSnoTStatistics:
    """One linear's running ||X_j||^2, mu_j and var_j (one calibration sample per call)."""

    def __init__(self, columns: int):
        self.scaler = torch.zeros(columns, dtype=torch.float32)  # [in]
        self.sum = torch.zeros(columns, dtype=torch.float32)  # [in]
        self.var = torch.zeros(columns, dtype=torch.float32)  # [in]
        self.samples = 0
        self.tokens = 0

    def add(self, inp: torch.Tensor) -> None:
        """inp: [1, tokens, in], one sample."""
        x = inp.reshape(-1, inp.shape[-1]).t().float()  # [in, tokens]
        tokens = x.shape[1]
        var = torch.var(x, dim=1, unbiased=False)  # [in]
        self.var = var if self.tokens == 0 else (self.var * self.tokens + var * tokens) / (self.tokens + tokens)
        self.tokens += tokens
        self.scaler *= self.samples / (self.samples + 1)
        self.sum *= self.samples / (self.samples + 1)
        self.samples += 1
        self.scaler += torch.norm(x, p=2, dim=1) ** 2 / self.samples
        self.sum += torch.sum(x, dim=1) / self.samples


def refine_row(effect: np.ndarray, pruned: np.ndarray, grow_value: np.ndarray, wanda: np.ndarray,
               error: np.float32, max_cycles: int, threshold: float):
    """Step 3 for one row until it stops; returns (the pruned flags, cycles active, the state a
    stopped row's later cycles need). effect, grow_value, wanda: float32 [in]; pruned: bool [in]."""
    pruned = pruned.copy()
    grow_order = np.argsort(grow_value, kind="stable")  # ascending
    kept = [int(j) for j in np.argsort(np.where(pruned, np.inf, wanda), kind="stable") if not pruned[j]]
    negatives = [j for j in kept if effect[j] < 0]
    zeros = [kept[0]] * sum(1 for j in kept if effect[j] == 0)
    positives = [j for j in kept if effect[j] > 0][::-1]
    prune_order = negatives + zeros + positives
    grow_at = [0, len(grow_order) - 1]
    prune_at = [0, len(prune_order) - 1]
    active = 0
    while active < max_cycles:
        grow_side, prune_side = int(error > 0), int(error < 0)
        grow = int(grow_order[grow_at[grow_side]])
        prune = prune_order[prune_at[prune_side]]
        grow_at[grow_side] += 1 if grow_side == 0 else -1
        prune_at[prune_side] += 1 if prune_side == 0 else -1
        if not abs(error) > np.float32(threshold):  # compared in float32, as torch does
            return pruned, active, (grow, prune, grow_order, prune_order, grow_at, prune_at, error)
        active += 1
        pruned[prune] = True
        pruned[grow] = False
        error = np.float32(error + effect[prune])
        error = np.float32(error - effect[grow])
    return pruned, active, None


def finish_row(pruned: np.ndarray, state, cycles_left: int) -> None:
    """A stopped row during the matrix's remaining cycles: grow candidate pruned, prune candidate
    kept (the reference writes the row's "no update" into both)."""
    grow, prune, grow_order, prune_order, grow_at, prune_at, error = state
    for cycle in range(cycles_left):
        if cycle:
            grow_side, prune_side = int(error > 0), int(error < 0)
            grow = int(grow_order[grow_at[grow_side]])
            prune = prune_order[prune_at[prune_side]]
            grow_at[grow_side] += 1 if grow_side == 0 else -1
            prune_at[prune_side] += 1 if prune_side == 0 else -1
        pruned[prune] = False
        pruned[grow] = True


def dsnot_mask(weight: torch.Tensor, stats: DSnoTStatistics, initial: torch.Tensor, max_cycles: int = 50,
               threshold: float = 0.1, pow_of_var: float = 1.0) -> torch.Tensor:
    """The refined mask (True = pruned) of one linear; weight, initial: [out, in]."""
    effect = (weight.float() * stats.sum.reshape(1, -1))  # [out, in]
    wanda = torch.abs(weight.float()) * torch.sqrt(stats.scaler.reshape(1, -1))  # [out, in]
    masked = torch.where(initial, effect, torch.zeros_like(effect))  # [out, in]
    errors = torch.sum(masked, dim=1)  # [out]
    grow_values = masked / torch.pow(stats.var.reshape(1, -1), pow_of_var) if pow_of_var else masked
    rows = []
    for i in range(weight.shape[0]):
        rows.append(refine_row(effect[i].numpy(), initial[i].numpy(), grow_values[i].numpy(),
                               wanda[i].numpy(), np.float32(errors[i].item()), max_cycles, threshold))
    # the matrix cycles while any row is active: one more cycle after the last active one
    cycles = min(max_cycles, max(active for _, active, _ in rows) + 1)
    result = np.stack([pruned for pruned, _, _ in rows])
    for i, (pruned, active, state) in enumerate(rows):
        if state is not None:
            finish_row(result[i], state, cycles - active)
    return torch.from_numpy(result)


@torch.no_grad()
def dsnot_oracle(model: nn.Module, token_ids: torch.Tensor, sparsity: float = 0.5,
                 nm: tuple[int, int] | None = None, initial: str = "wanda", max_cycles: int = 50,
                 threshold: float = 0.1, pow_of_var: float = 1.0, skip: str = "mlp") -> None:
    """Prune `model` (a Hugging Face Llama) in place with calibration `token_ids` [N, T]."""
    if nm is not None:
        raise ValueError("the DSnoT oracle covers unstructured sparsity")

    def make_observer(linears):
        stats = {name: DSnoTStatistics(linear.in_features) for name, linear in linears.items()}
        return (lambda name, x: stats[name].add(x)), stats

    def prune_layer(linears, stats):
        for name, linear in linears.items():
            weight = linear.weight.data
            wanda = torch.abs(weight) * torch.sqrt(stats[name].scaler.reshape(1, -1))  # [out, in]
            mask = row_mask(wanda if initial == "wanda" else torch.abs(weight), sparsity)
            if name.split(".")[0] != skip:
                mask = dsnot_mask(weight, stats[name], mask, max_cycles, threshold, pow_of_var)
            weight[mask] = 0

    layer_by_layer(model, token_ids, make_observer, prune_layer)
