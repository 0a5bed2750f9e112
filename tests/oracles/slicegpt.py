"""Oracle for SliceGPT on Llama models: rotate each point of the residual stream to its principal
components and delete the smallest ones.

Ashkboos, Croci, do Nascimento, Hoefler & Hensman, "SliceGPT: Compress Large Language Models by
Deleting Rows and Columns", ICLR 2024 (microsoft/TransformerCompression,
`rotate.rotate_and_slice_sequential`, `experiments/run_slicegpt.py` defaults), written from the
paper and the repository's protocol as plain code over the Hugging Face modules; imports nothing
from prunelab.

The paper in torch's layout (a linear stores W as [out, in] and computes x W^T):
- norms first (section 3.2): the RMSNorm scale diag(alpha) moves into the linears that read the
  norm's output (W <- W diag(alpha), column-wise: q/k/v after the attention norm, gate/up after the
  MLP norm, the head after the final norm), leaving a weightless norm x / sqrt(sum(x^2) / D + 1e-5)
  with D the dense width even once the input is sliced (a rotation keeps ||x||; the reference's
  RMSN). The reference also subtracts each embedding row's mean over the hidden dimension (its
  LayerNorm-to-RMSNorm step, applied to RMSNorm models too) and unties the head (a copy). Weights
  are fused in float64 and stored back in the model's dtype, before any rotation.
- one PCA per residual point (section 3.3): C = sum over the calibration batches of X^T X in
  float64, uncentred and not divided by the number of tokens, plus 0.01 * mean(diag C) on the
  diagonal; Q its eigenvectors, ordered by descending eigenvalue. The points: layer 0's input (the
  embeddings), then per layer the residual between attention and MLP (the MLP norm's input) and the
  layer's output.
- deletion (section 3.4): keep d = int((1 - sparsity) D), rounded down to a multiple of
  `round_interval`, of every rotated residual point: the embeddings become E Q[:, :d]; the linears
  reading a point get W Q[:, :d] (input columns), those writing one (o_proj, down_proj) get
  Q[:, :d]^T W (output rows); the residual connection, which now joins two bases, goes through
  Q_in[:, :d]^T Q_out[:, :d] (a d x d "shortcut" matrix). The head reads the last point rotated
  but is never sliced, so the last layer writes all D rotated dimensions.
- the signals (the repository's sequential protocol): each layer sees the previous layer's sliced
  outputs X (kept in the dense basis), fed as (X Q[:, :d]) in batches; the MLP-norm input is taken
  with the layer's input side rotated and sliced and everything after it still dense (the shortcut
  Q[:, :d]^T carries the sliced input back to the dense basis); the layer's output once the
  attention output and MLP input are rotated and sliced too (the MLP shortcut Q_mid[:, :d]^T, down
  still dense). Rotations and slices are in float64 and stored in the model's dtype; the shortcut
  products and the rotated signals are computed in the model's dtype, as the repository does.
- orientation: "pca" keeps the principal axes; "random" (the repository's default) multiplies each
  basis by an orthogonal matrix that mixes only the kept directions: the Q of the QR decomposition
  of a uniform [0, 1) d x d matrix (`rng.rand`), in the upper-left block of an identity, drawn in
  the order of the PCAs (the last output's block is D wide). The repository draws from the global,
  unseeded np.random; the oracle from `np.random.RandomState(seed)`.

Non-reference switches, to show that a comparison can fail: `centre` subtracts the signal's mean
(over all its tokens) before the products, `damping` other than 0.01, `subtract_embedding_mean`
False skips the reference's embedding step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from oracles.llama_layers import capture_layer0_inputs, run_layer

EPS = 1e-5  # the reference's RMSN constant (not the config's rms_norm_eps)


class WeightlessRMSNorm(nn.Module):
    """x / sqrt(sum(x^2) / D + eps) with D the dense hidden size (the norm's scale is fused away)."""

    def __init__(self, dense_width: int):
        super().__init__()
        self.dense_width = dense_width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean_square = x.pow(2).sum(-1, keepdim=True) / self.dense_width
        return x * torch.rsqrt(mean_square + EPS)


class SlicedDecoderLayer(nn.Module):
    """A Llama decoder layer whose two residual connections go through shortcut matrices
    (identity while None); `mids`, when a list, receives the residual between attention and MLP."""

    def __init__(self, layer: nn.Module, dense_width: int):
        super().__init__()
        self.self_attn, self.mlp = layer.self_attn, layer.mlp
        self.attn_norm, self.mlp_norm = WeightlessRMSNorm(dense_width), WeightlessRMSNorm(dense_width)
        self.attn_shortcut: torch.Tensor | None = None  # [d_in, d_mid]
        self.mlp_shortcut: torch.Tensor | None = None  # [d_mid, d_out]
        self.mids: list[torch.Tensor] | None = None

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        attended, _ = self.self_attn(hidden_states=self.attn_norm(x), **kwargs)
        skip = x if self.attn_shortcut is None else torch.matmul(x, self.attn_shortcut)
        between = skip + attended
        if self.mids is not None:
            self.mids.append(between)
        mlp_out = self.mlp(self.mlp_norm(between))
        skip = between if self.mlp_shortcut is None else torch.matmul(between, self.mlp_shortcut)
        return skip + mlp_out


def kept_width(hidden: int, sparsity: float, round_interval: int) -> int:
    d = int((1 - sparsity) * hidden)
    return d - d % round_interval


def principal_components(signals: list[torch.Tensor], damping: float = 0.01, centre: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(eigenvalues descending, eigenvectors as columns) of C = sum_batches X^T X (float64),
    damped; `signals` one [B, T, C] per calibration batch."""
    width = signals[0].shape[-1]
    mean = None
    if centre:  # non-reference
        rows = sum(X.shape[0] * X.shape[1] for X in signals)
        mean = sum(X.double().reshape(-1, width).sum(dim=0) for X in signals) / rows
    C = torch.zeros(width, width, dtype=torch.float64)
    for batch in signals:
        batch_sum = torch.zeros(width, width, dtype=torch.float64)
        for X in batch.double():  # one sequence, [T, C]: the paper's sum over sequences of X_i^T X_i
            if mean is not None:
                X = X - mean
            batch_sum += X.T @ X
        C += batch_sum
    C += damping * torch.diag(C).mean() * torch.eye(width, dtype=torch.float64)
    values, vectors = torch.linalg.eigh(C)
    order = torch.argsort(values, descending=True)
    return values[order], vectors[:, order]


def random_rotation_of_kept(width: int, kept: int, rng: np.random.RandomState) -> torch.Tensor:
    """[width, width] float64 identity with a random orthogonal [kept, kept] upper-left block."""
    block, _ = np.linalg.qr(rng.rand(kept, kept))
    R = np.eye(width)
    R[:kept, :kept] = block
    return torch.from_numpy(R)


def _set(linear: nn.Linear, weight: torch.Tensor) -> None:
    linear.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
    linear.out_features, linear.in_features = weight.shape


@torch.no_grad()
def slicegpt_oracle(model: nn.Module, token_ids: torch.Tensor, sparsity: float = 0.25,
                    round_interval: int = 8, orientation: str = "pca", seed: int = 0,
                    batch_size: int = 16, *, centre: bool = False, damping: float = 0.01,
                    subtract_embedding_mean: bool = True) -> dict[str, Any]:
    """Slice a dense Llama `model` in place (every decoder layer it has; truncate it first to
    test the first layers); returns {"dim": d, "eigenvalues": one float64 vector per PCA (the
    embeddings', then per layer the MLP-norm input's and the output's)}.

    The model stays runnable (`model(ids).logits`): its layers become `SlicedDecoderLayer`s whose
    `attn_shortcut` / `mlp_shortcut` hold the shortcut matrices; embeddings, q/k/v/o, gate/up/down
    and the (untied) head hold the rotated, sliced weights."""
    if orientation not in ("pca", "random"):
        raise ValueError(f"orientation is pca or random, not {orientation!r}")
    config, inner = model.config, model.model
    D = config.hidden_size
    d = kept_width(D, sparsity, round_interval)
    dtype = inner.embed_tokens.weight.dtype
    rng = np.random.RandomState(seed)

    def orient(Q: torch.Tensor, kept: int) -> torch.Tensor:
        return Q @ random_rotation_of_kept(Q.shape[0], kept, rng) if orientation == "random" else Q

    # 1. Fuse the norms' scales into the linears that read them; untie the head; centre the embeddings.
    head = model.lm_head
    head.weight = nn.Parameter(head.weight.detach().clone(), requires_grad=False)
    config.tie_word_embeddings = False
    E = inner.embed_tokens.weight.detach().double()  # [V, D]
    if subtract_embedding_mean:
        E = E - E.mean(dim=1, keepdim=True)
    inner.embed_tokens.weight = nn.Parameter(E.to(dtype), requires_grad=False)
    for index, layer in enumerate(list(inner.layers)):
        attn, mlp = layer.self_attn, layer.mlp
        if attn.o_proj.bias is not None or mlp.down_proj.bias is not None:
            raise ValueError("the oracle handles Llama layers without biases on o_proj / down_proj")
        alpha = layer.input_layernorm.weight.double()  # [D]
        beta = layer.post_attention_layernorm.weight.double()
        for linear in (attn.q_proj, attn.k_proj, attn.v_proj):
            _set(linear, (linear.weight.double() * alpha).to(dtype))
        for linear in (mlp.gate_proj, mlp.up_proj):
            _set(linear, (linear.weight.double() * beta).to(dtype))
        inner.layers[index] = SlicedDecoderLayer(layer, D)
    _set(head, (head.weight.double() * inner.norm.weight.double()).to(dtype))
    inner.norm = WeightlessRMSNorm(D)

    # 2. The embeddings: PCA of layer 0's inputs, in the reference's calibration batches.
    inputs, kwargs = capture_layer0_inputs(model, token_ids, batch_size)
    values, Q = principal_components(inputs, damping, centre)
    eigenvalues = [values]
    Q = orient(Q, d)
    inner.embed_tokens.weight = nn.Parameter((inner.embed_tokens.weight.double() @ Q).to(dtype)[:, :d],
                                             requires_grad=False)
    inner.embed_tokens.embedding_dim = d

    # 3. Layer by layer.
    last = len(inner.layers) - 1
    for index, layer in enumerate(inner.layers):
        attn, mlp = layer.self_attn, layer.mlp
        width_out = D if index == last else d  # the head is not sliced
        Q_in = Q
        for linear in (attn.q_proj, attn.k_proj, attn.v_proj):
            _set(linear, (linear.weight.double() @ Q_in).to(dtype)[:, :d])
        sliced = [torch.matmul(X, Q_in.to(dtype))[:, :, :d] for X in inputs]  # [B, T, d]
        layer.attn_shortcut = Q_in.T.to(dtype)[:d, :]  # [d, D]: back to the dense basis

        layer.mids = []
        for X, kw in zip(sliced, kwargs):
            run_layer(layer, X, kw)
        mids, layer.mids = layer.mids, None
        values, Q_mid = principal_components(mids, damping, centre)
        eigenvalues.append(values)
        Q_mid = orient(Q_mid, d)
        layer.attn_shortcut = torch.matmul(layer.attn_shortcut, Q_mid.to(dtype)[:, :d])  # [d, d]
        _set(attn.o_proj, (Q_mid.T @ attn.o_proj.weight.double()).to(dtype)[:d, :])
        for linear in (mlp.gate_proj, mlp.up_proj):
            _set(linear, (linear.weight.double() @ Q_mid).to(dtype)[:, :d])
        layer.mlp_shortcut = Q_mid.T.to(dtype)[:d, :]  # [d, D]

        outputs = [run_layer(layer, X, kw) for X, kw in zip(sliced, kwargs)]  # [B, T, D], dense basis
        values, Q = principal_components(outputs, damping, centre)
        eigenvalues.append(values)
        Q = orient(Q, width_out)
        layer.mlp_shortcut = torch.matmul(layer.mlp_shortcut, Q.to(dtype))[:, :width_out]  # [d, out]
        _set(mlp.down_proj, (Q.T @ mlp.down_proj.weight.double()).to(dtype)[:width_out, :])
        inputs = outputs

    # 4. The head reads the last output rotated, all D of it.
    _set(head, (head.weight.double() @ Q).to(dtype))
    return {"dim": d, "eigenvalues": eigenvalues}

