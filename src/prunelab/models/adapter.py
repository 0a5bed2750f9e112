"""One small interface over every supported decoder-only architecture.

Methods, the calibration runner and the evaluators talk to a `ModelAdapter`, never to HF attribute
paths: the decoder layers, each layer's linears by role, the residual-writing projections, the norms,
how to run one layer alone, and how to remove layers so that the checkpoint still saves and reloads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
import contextlib
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn

from prunelab.models.architectures import Architecture, architecture_for
from prunelab.models.offloaded_weights import has_offloaded_weights, offloaded_modules, onloaded
from prunelab.models.streaming import LayerStore, store_of

ROLES = ("attn_in", "attn_out", "mlp_in", "mlp_out")
#: In captured layer kwargs: {layer type: that type's kwargs} for models whose layers differ in their
#: attention type (Gemma 3's sliding-window and global layers get different masks and rotary
#: embeddings); `call_layer` gives each layer its own type's.
BY_LAYER_TYPE = "prunelab_by_layer_type"


def layer_type_of(layer: nn.Module) -> str | None:
    """A decoder layer's attention type (`sliding_attention`, `full_attention`), read from the module
    that carries it (transformers 5 sets `layer_type` on the attention); None when none does."""
    for module in layer.modules():
        value = getattr(module, "layer_type", None)
        if isinstance(value, str):
            return value
    return None


def input_device(model: nn.Module) -> torch.device:
    """Where token ids must go: the input embedding's device, or, when accelerate has offloaded
    the embedding (its weight on `meta`), the device its hook executes on."""
    store = store_of(model)
    if store is not None:  # streamed: the embeddings are read onto the store's device when used
        return store.device
    embeddings = model.get_input_embeddings()
    hook = getattr(embeddings, "_hf_hook", None)
    executes = getattr(hook, "execution_device", None)
    if executes is not None:
        return torch.device(f"cuda:{executes}" if isinstance(executes, int) else executes)
    device = embeddings.weight.device
    return torch.device("cpu") if device.type == "meta" else device


class ModelAdapter:
    """Architecture-aware access to a loaded `*ForCausalLM` model."""

    def __init__(self, model: nn.Module, architecture: Architecture | None = None):
        self.model = model
        self.arch = architecture or architecture_for(model.config.model_type)

    @property
    def store(self) -> LayerStore | None:
        """The LayerStore of a streamed model (decoder layers on disk), None when in memory."""
        return store_of(self.model)

    @property
    def streamed(self) -> bool:
        return self.store is not None

    @property
    def dispatched(self) -> bool:
        """Placed by accelerate (`device_map`): parts may sit on other devices or be offloaded, so
        only the model's own forward (with its hooks) or `layer_in_memory` may run its layers."""
        return bool(getattr(self.model, "hf_device_map", None))

    @property
    def config(self):
        return self.model.config

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def parallel_residual(self) -> bool:
        return bool(getattr(self.config, "use_parallel_residual", self.arch.parallel_residual))

    # --- structure -----------------------------------------------------------------------------
    @property
    def layers(self) -> nn.ModuleList:
        return self.model.get_submodule(self.arch.layers)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def linears(self, layer: nn.Module, roles: Sequence[str] = ROLES) -> dict[str, nn.Linear]:
        """The layer's linears in forward order, keyed by path relative to the layer."""
        names: list[str] = []
        for role in roles:
            value = getattr(self.arch, role)
            names.extend(value if isinstance(value, tuple) else (value,))
        return {name: layer.get_submodule(name) for name in names}

    def linear_weights(self, layer: nn.Module) -> list[torch.Tensor]:
        """The weights ([out, in]) of the layer's linears, in forward order."""
        return [linear.weight for linear in self.linears(layer).values()]

    def linear_groups(self, layer: nn.Module) -> list[dict[str, nn.Linear]]:
        """Linears grouped by what they read, in forward order (for "true sequential" pruning)."""
        return [self.linears(layer, (role,)) for role in ROLES]

    def role_of(self, name: str) -> str:
        for role in ROLES:
            value = getattr(self.arch, role)
            if name in (value if isinstance(value, tuple) else (value,)):
                return role
        raise KeyError(name)

    def residual_writers(self, layer: nn.Module) -> tuple[nn.Linear, nn.Linear]:
        """(attention output projection, MLP output projection): what writes into the residual."""
        return layer.get_submodule(self.arch.attn_out), layer.get_submodule(self.arch.mlp_out)

    def norms(self, layer: nn.Module) -> tuple[nn.Module, nn.Module]:
        """(norm before attention, norm before the MLP): the ones that read the residual stream."""
        return layer.get_submodule(self.arch.attn_norm), layer.get_submodule(self.arch.mlp_norm)

    def post_norms(self, layer: nn.Module) -> tuple[nn.Module, ...]:
        """(norm of the attention output, norm of the MLP output) applied before each joins the
        residual (Gemma 3); () where the blocks write the residual directly."""
        paths = (self.arch.attn_post_norm, self.arch.mlp_post_norm)
        return tuple(layer.get_submodule(p) for p in paths if p)

    @property
    def mlp_output_joins_residual(self) -> bool:
        """Whether the MLP output projection's output is added to the residual as it is: False where a
        post-norm sits between them (Gemma 3), so a linear map folded into that projection would
        not act linearly on the residual."""
        return not self.arch.mlp_post_norm

    def qk_norms(self, layer: nn.Module) -> tuple[nn.Module, ...]:
        """The per-head query and key norms (Qwen3, Gemma 3); () where there are none."""
        return tuple(layer.get_submodule(p) for p in self.arch.qk_norms)

    def all_norms(self, layer: nn.Module) -> list[nn.Module]:
        """Every norm of a decoder layer: pre-norms, post-norms, q/k norms."""
        return [*self.norms(layer), *self.post_norms(layer), *self.qk_norms(layer)]

    def norm_gain(self, norm: nn.Module) -> torch.Tensor:
        """What an RMSNorm multiplies the normalised input by: `weight`, or (1 + weight) on Gemma."""
        return norm.weight + self.arch.norm_offset if self.arch.norm_offset else norm.weight

    @property
    def embedding_scale(self) -> float:
        """The factor the input embedding module applies to the looked-up rows (Gemma:
        sqrt(hidden size)); 1 elsewhere."""
        if not self.arch.scaled_embeddings:
            return 1.0
        return float(getattr(self.model.get_input_embeddings(), "embed_scale"))

    @property
    def layer_types(self) -> list[str] | None:
        """Each decoder layer's attention type when the layers differ in it (Gemma 3: sliding
        window or global), else None. Read from the layers, so it follows removals and swaps."""
        types = [layer_type_of(layer) for layer in self.layers]
        return types if None not in types and len(set(types)) > 1 else None

    @property
    def final_norm(self) -> nn.Module:
        return self.model.get_submodule(self.arch.final_norm)

    @property
    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    @contextmanager
    def layer_in_memory(self, index: int, device: torch.device | None = None) -> Iterator[nn.Module]:
        """Decoder layer `index` with its weights in memory for the duration. A resident model's
        layer as it is; a streamed model's read from its shards (and written back if changed),
        on `device` when given; one whose weights accelerate offloaded (`device_map="auto"` with a
        `max_memory`) brought in by its hook and what changed written back (`models.offload`)."""
        layer = self.layers[index]
        store = self.store
        if store is None:
            with onloaded(layer) if has_offloaded_weights(layer) else nullcontext():
                yield layer
            return
        with store.resident(layer, device):
            yield layer

    @contextmanager
    def outside_in_memory(self, which: str = "all") -> Iterator[None]:
        """A streamed model's input embeddings ("embeddings"), untied head ("head") or both
        ("all") in memory for the duration (they stay on disk between the passes that use them);
        nothing to do for a resident model."""
        store = self.store
        if store is None:
            with contextlib.ExitStack() as stack:  # offloaded by accelerate: every part outside the
                for module in self._offloaded_outside_layers():  # layers (embeddings, norm, head)
                    stack.enter_context(onloaded(module))
                yield
            return
        with store.outside_resident(which):
            yield

    def _offloaded_outside_layers(self) -> list[nn.Module]:
        inside = {id(module) for module in self.layers.modules()}
        return [module for module in offloaded_modules(self.model) if id(module) not in inside]

    def layers_in_memory(self) -> Iterator[tuple[int, nn.Module]]:
        """(index, layer) for every decoder layer, each in memory while the loop body runs."""
        for index in range(self.num_layers):
            with self.layer_in_memory(index) as layer:
                yield index, layer

    def outside_layer_parameters(self) -> list[nn.Parameter]:
        """Parameters outside the decoder layers (embeddings, final norm, head; tied ones once).
        On a streamed model the embeddings and an untied head are on meta outside
        `outside_in_memory`."""
        layer_params = {id(p) for p in self.layers.parameters()}
        return [p for p in self.model.parameters() if id(p) not in layer_params]

    def prunable_linears(self) -> dict[str, nn.Linear]:
        """Every linear inside the decoder layers (embeddings and lm_head are never pruned).
        On a streamed model their weights are on the meta device: use `layers_in_memory`."""
        out: dict[str, nn.Linear] = {}
        for index, layer in enumerate(self.layers):
            for name, module in self.linears(layer).items():
                out[f"layers.{index}.{name}"] = module
        return out

    # --- running one layer -----------------------------------------------------------------------
    @staticmethod
    def call_layer(layer: nn.Module, hidden: torch.Tensor, layer_kwargs: dict[str, Any]) -> torch.Tensor:
        """Run one decoder layer alone with the keyword arguments captured at layer 0 (for a model
        with several attention types, those captured for the layer's own type)."""
        by_type = layer_kwargs.get(BY_LAYER_TYPE)
        if by_type is not None:
            layer_kwargs = by_type[layer_type_of(layer)]
        out = layer(hidden, **layer_kwargs)
        return out[0] if isinstance(out, tuple) else out

    @contextmanager
    def passing_through(self, count: int, record: list, stop: type[BaseException]) -> Iterator[None]:
        """The first `count` decoder layers pass their input through unchanged (nothing is computed,
        a streamed layer is never read) while each call is appended to `record` as (index, hidden
        states, keyword arguments); the call of layer `count - 1` raises `stop`. Pre-hooks already
        on the layers (recovery operators) still run first. How the calibration capture gets the
        keyword arguments of every attention type, which the model hands to its layers by type."""
        handles, saved = [], []
        for index in range(count):
            layer = self.layers[index]
            saved.append((layer, layer.__dict__.get("forward")))

            def forward(hidden_states: torch.Tensor | None = None, *args: Any, **kwargs: Any) -> torch.Tensor:
                return hidden_states

            def hook(_module: nn.Module, args: tuple, kwargs: dict, index: int = index):
                hidden = args[0] if args else kwargs.get("hidden_states")
                record.append((index, hidden, {k: v for k, v in kwargs.items() if k != "hidden_states"}))
                if index == count - 1:
                    raise stop

            layer.forward = forward
            handles.append(layer.register_forward_pre_hook(hook, with_kwargs=True))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            for layer, previous in saved:
                if previous is None:
                    del layer.forward
                else:
                    layer.forward = previous

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm then lm_head: the part of the forward pass after the last decoder layer (and
        the tanh soft-capping of the logits where the config asks for it, as Gemma's may)."""
        with self.outside_in_memory("head"):
            logits = self.lm_head(self.final_norm(hidden))
        cap = getattr(self.config, "final_logit_softcapping", None)
        return torch.tanh(logits / cap) * cap if cap else logits

    @contextmanager
    def layers_replaced(self, layers: Sequence[nn.Module]) -> Iterator[None]:
        """Temporarily run the model with another layer list (the dense layers after depth
        pruning, a swapped order for a probe); config and layer indices are restored on exit."""
        parent_path, _, attr = self.arch.layers.rpartition(".")
        parent = self.model.get_submodule(parent_path)
        saved, saved_n = getattr(parent, attr), self.config.num_hidden_layers
        saved_types = getattr(self.config, "layer_types", None)
        setattr(parent, attr, nn.ModuleList(layers))
        self.config.num_hidden_layers = len(layers)
        if isinstance(saved_types, list):  # the model hands masks and rotary embeddings out by type
            self.config.layer_types = [layer_type_of(layer) or saved_types[0] for layer in layers]
        try:
            yield
        finally:
            setattr(parent, attr, saved)
            self.config.num_hidden_layers = saved_n
            if isinstance(saved_types, list):
                self.config.layer_types = saved_types

    # --- removing layers -------------------------------------------------------------------------
    def remove_layers(self, indices: Iterable[int]) -> list[int]:
        """Delete decoder layers in place; the model then saves and reloads with fewer layers.

        Renumbers each attention's `layer_idx` (the KV cache indexes by it) and shortens
        per-layer config lists such as Qwen's and Gemma 3's `layer_types` (each surviving layer
        keeps its own sliding-window or global type) and a width-pruned model's
        `prunelab_layer_shapes`. Returns the sorted removed indices.
        """
        drop = sorted(set(int(i) for i in indices))
        n = self.num_layers
        if any(i < 0 or i >= n for i in drop):
            raise ValueError(f"layer indices {drop} out of range for a model with {n} layers")
        keep = [i for i in range(n) if i not in drop]
        new_layers = nn.ModuleList([self.layers[i] for i in keep])
        parent_path, _, attr = self.arch.layers.rpartition(".")
        setattr(self.model.get_submodule(parent_path), attr, new_layers)
        for new_index, layer in enumerate(new_layers):
            for module in layer.modules():
                if hasattr(module, "layer_idx"):
                    module.layer_idx = new_index
        self.config.num_hidden_layers = len(keep)
        for key in ("layer_types", "prunelab_layer_shapes"):  # per-layer lists (models.width's shapes)
            values = getattr(self.config, key, None)
            if isinstance(values, list) and len(values) == n:
                setattr(self.config, key, [values[i] for i in keep])
        return drop
