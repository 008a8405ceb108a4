"""Catalog of base models: the transformer shapes the cost model needs.

Shapes are from each model's published ``config.json`` (Hugging Face model cards):
Llama-3-8B / Llama-3-70B (meta-llama), Qwen3-8B and Qwen2.5-32B (Qwen). LoRA targets every
linear layer of a decoder block (q, k, v, o, gate, up, down), as in the tLoRA and LoRAFusion
evaluations.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from tlora_sim.traces.errors import InputError


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape.

    Attributes:
        name: catalog key, e.g. ``"llama3-8b"``.
        hidden: model width d (elements).
        layers: decoder blocks.
        ffn: MLP intermediate width (elements).
        heads: attention query heads.
        kv_heads: key/value heads (grouped-query attention).
        head_dim: elements per head.
        vocab: vocabulary size (tokens).
    """

    name: str
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @cached_property
    def linear_shapes(self) -> tuple[tuple[str, int, int], ...]:
        """The LoRA-targeted linear layers of one block as ``(name, d_in, d_out)``."""
        d, q, kv, f = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.ffn
        return (("q", d, q), ("k", d, kv), ("v", d, kv), ("o", q, d),
                ("gate", d, f), ("up", d, f), ("down", f, d))

    @cached_property
    def block_linear_params(self) -> int:
        """Frozen weights in one block's linear layers (elements)."""
        return sum(i * o for _, i, o in self.linear_shapes)

    @cached_property
    def params(self) -> int:
        """All frozen weights: blocks plus untied embedding and LM head (elements)."""
        return self.layers * self.block_linear_params + 2 * self.vocab * self.hidden

    @cached_property
    def lora_dims_per_rank(self) -> int:
        """Σ (d_in + d_out) over all targeted layers of the model: LoRA params = rank x this."""
        return self.layers * sum(i + o for _, i, o in self.linear_shapes)

    def lora_params(self, rank: int) -> int:
        """Trainable adapter parameters at ``rank`` (elements): r x Σ (d_in + d_out)."""
        return rank * self.lora_dims_per_rank


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("llama3-8b", hidden=4096, layers=32, ffn=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256),
        ModelSpec("qwen3-8b", hidden=4096, layers=36, ffn=12288, heads=32, kv_heads=8, head_dim=128, vocab=151936),
        ModelSpec("qwen2.5-32b", hidden=5120, layers=64, ffn=27648, heads=40, kv_heads=8, head_dim=128, vocab=152064),
        ModelSpec("llama3-70b", hidden=8192, layers=80, ffn=28672, heads=64, kv_heads=8, head_dim=128, vocab=128256),
    )
}


def get_model(name: str) -> ModelSpec:
    """Look up a base model by catalog name.

    Raises:
        InputError: unknown name (the message lists the known ones).
    """
    try:
        return MODELS[name]
    except KeyError:
        raise InputError(f"unknown base model {name!r}; known: {', '.join(MODELS)}", field="model") from None
