"""Oracle for SparseGPT: one-shot pruning with the optimal brain surgeon update.

Frantar & Alistarh, "SparseGPT: Massive Language Models Can Be Accurately Pruned in One-Shot",
2023 (IST-DASLab/sparsegpt `SparseGPT.fasterprune`, as run by locuslab/wanda `prune_sparsegpt`).
Layer by layer, the pruned outputs of each layer feeding the next; all linears of a layer take their
Hessian from one forward pass (not "true sequential"):
1. Hessian, per forward of b samples after n seen, X the linear's input as [in, tokens]:
   H *= n / (n + b);  n += b;  X = sqrt(2 / n) * X.float();  H += X @ X.T;
2. W a float32 copy; dead inputs (diag H == 0) get H_dd = 1 and W[:, d] = 0; damp = 0.01 x mean
   diag H is added to the diagonal; Hinv = cholesky(cholesky_inverse(cholesky(H)), upper=True);
3. columns in blocks of 128. Unstructured: at each block, tmp = W1**2 / diag(Hinv1)**2 over the
   whole [rows, 128] block, threshold = sort(tmp.flatten())[int(tmp.numel() * s)], pruned where
   tmp <= threshold. N:M: at every column i with i % m == 0, the n lowest of tmp over the next m
   columns of the already-updated block (topk, largest=False);
4. per column: q = w with the pruned entries zeroed; err = (w - q) / Hinv1[i, i];
   W1[:, i:] -= err (outer) Hinv1[i, i:]; after the block W[:, i1:i2] = Q1 and
   W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:].
For testing prunelab's `pruning=sparsegpt` against the protocol; imports nothing from prunelab.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from oracles.llama_layers import layer_by_layer

BLOCKSIZE = 128
PERCDAMP = 0.01


class RunningHessian:
    """H = (2 / n) sum X X^T over the samples seen, for one linear's inputs."""

    def __init__(self, columns: int):
        self.H = torch.zeros(columns, columns, dtype=torch.float32)  # [in, in]
        self.samples = 0

    def add(self, inp: torch.Tensor) -> None:
        """inp: the linear's input for one forward, [b, tokens, in] (or [tokens, in] for b = 1)."""
        if inp.dim() == 2:
            inp = inp.unsqueeze(0)
        batch = inp.shape[0]
        x = inp.reshape(-1, inp.shape[-1]).t()  # [in, tokens]
        self.H *= self.samples / (self.samples + batch)
        self.samples += batch
        x = math.sqrt(2 / self.samples) * x.float()
        self.H += x.matmul(x.t())


def upper_inverse_factor(H: torch.Tensor) -> torch.Tensor:
    """The damped inverse Hessian's upper Cholesky factor. H: [in, in], damped in place."""
    columns = torch.arange(H.shape[0])
    H[columns, columns] += PERCDAMP * torch.mean(torch.diag(H))
    H = torch.linalg.cholesky(H)
    H = torch.cholesky_inverse(H)
    return torch.linalg.cholesky(H, upper=True)


def solve(weight: torch.Tensor, H: torch.Tensor, sparsity: float,
          nm: tuple[int, int] | None = None) -> torch.Tensor:
    """Pruned and updated float32 weights [out, in]; `weight` is read only, `H` is consumed."""
    W = weight.clone().float()  # [out, in]
    rows, cols = W.shape
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    Hinv = upper_inverse_factor(H)  # [in, in]

    for i1 in range(0, cols, BLOCKSIZE):
        i2 = min(i1 + BLOCKSIZE, cols)
        W1 = W[:, i1:i2].clone()  # [out, width], updated column by column
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        d1 = torch.diag(Hinv1)  # [width]
        if nm is None:
            tmp = W1**2 / d1.reshape((1, -1)) ** 2
            threshold = torch.sort(tmp.flatten())[0][int(tmp.numel() * sparsity)]
            pruned = tmp <= threshold  # [out, width]
        else:
            pruned = torch.zeros_like(W1, dtype=torch.bool)
        for i in range(i2 - i1):
            if nm is not None and i % nm[1] == 0:
                n, m = nm
                tmp = W1[:, i : i + m] ** 2 / d1[i : i + m].reshape((1, -1)) ** 2  # [out, m]
                pruned.scatter_(1, i + torch.topk(tmp, n, dim=1, largest=False)[1], True)
            w = W1[:, i]
            q = w.clone()
            q[pruned[:, i]] = 0
            Q1[:, i] = q
            err = (w - q) / Hinv1[i, i]  # [out]
            W1[:, i:] -= err.unsqueeze(1).matmul(Hinv1[i, i:].unsqueeze(0))
            Err1[:, i] = err
        W[:, i1:i2] = Q1
        W[:, i2:] -= Err1.matmul(Hinv[i1:i2, i2:])
    return W


@torch.no_grad()
def sparsegpt_oracle(model: nn.Module, token_ids: torch.Tensor, sparsity: float = 0.5,
                     nm: tuple[int, int] | None = None) -> None:
    """Prune `model` (a Hugging Face Llama) in place with calibration `token_ids` [N, T]."""

    def make_observer(linears):
        hessians = {name: RunningHessian(linear.in_features) for name, linear in linears.items()}
        return (lambda name, x: hessians[name].add(x)), hessians

    def prune_layer(linears, hessians):
        for name, linear in linears.items():
            pruned = solve(linear.weight.data, hessians.pop(name).H, sparsity, nm)
            linear.weight.data = pruned.to(linear.weight.dtype)

    layer_by_layer(model, token_ids, make_observer, prune_layer)
