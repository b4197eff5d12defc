"""ModelSpec: the shape of a decoder-only transformer (dense or mixture-of-experts).

GPT-style (Megatron GPT, GPT-3): multi-head attention, 2-matrix GELU MLP, LayerNorm with
biases, learned positions, dropout. Llama-style: grouped-query attention, 3-matrix SwiGLU MLP,
RMSNorm, rotary positions, no biases, no dropout. MoE layers replace the MLP with ``num_experts``
expert MLPs of width ``moe_ffn_hidden_size`` of which each token visits ``moe_top_k``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ModelSpec(BaseModel):
    """What is trained. Sizes are element counts; derived sizes are properties."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Catalogue name or file stem.")
    family: Literal["gpt", "llama"] = Field(description="Architecture family, for display.")
    hidden_size: int = Field(gt=0, description="Model width h.")
    ffn_hidden_size: int = Field(gt=0, description="Dense MLP width f.")
    num_layers: int = Field(gt=0, description="Transformer layers L.")
    num_heads: int = Field(gt=0, description="Attention (query) heads a.")
    num_kv_heads: int = Field(gt=0, description="Key/value heads (= num_heads without GQA).")
    head_dim: int = Field(gt=0, description="Width of one head d.")
    vocab_size: int = Field(gt=0, description="Vocabulary V (before Megatron's padding).")
    max_position_embeddings: int = Field(gt=0, description="Longest sequence the model supports.")
    tie_embeddings: bool = Field(description="Output layer shares the input embedding matrix.")
    gated_mlp: bool = Field(description="SwiGLU (3 matrices) instead of a 2-matrix GELU MLP.")
    norm: Literal["layernorm", "rmsnorm"] = Field(description="Normalisation layer.")
    position: Literal["learned", "rope"] = Field(description="Learned absolute or rotary positions.")
    bias: bool = Field(description="Linear layers carry biases.")
    dropout: float = Field(ge=0, lt=1, description="Hidden and attention dropout probability.")
    num_experts: int = Field(default=0, ge=0, description="Experts per MoE layer; 0 = dense model.")
    moe_top_k: int = Field(default=0, ge=0, description="Experts each token is routed to.")
    moe_ffn_hidden_size: int = Field(default=0, ge=0, description="Width of one expert MLP.")
    moe_layer_freq: int = Field(default=1, ge=1, description="Every k-th layer is MoE (1 = all).")
    moe_first_dense_layers: int = Field(default=0, ge=0, description="Leading layers kept dense.")
    moe_shared_ffn_hidden_size: int = Field(default=0, ge=0, description="Shared-expert MLP width; 0 = none.")

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.num_experts:
            if not 0 < self.moe_top_k <= self.num_experts:
                raise ValueError(f"moe_top_k ({self.moe_top_k}) must be in 1..num_experts ({self.num_experts})")
            if self.moe_ffn_hidden_size <= 0:
                raise ValueError("an MoE model needs moe_ffn_hidden_size > 0")
        return self

    # ---- derived widths ----------------------------------------------------------------
    @property
    def q_width(self) -> int:
        """Query width a*d (= h for most models)."""
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of K (or V): kv_heads * d."""
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, layer: int) -> bool:
        """Layer ``layer`` (0-based) is MoE: past the dense prefix, every ``moe_layer_freq``-th."""
        return (
            self.is_moe
            and layer >= self.moe_first_dense_layers
            and ((layer - self.moe_first_dense_layers) % self.moe_layer_freq == 0)
        )

    def count_moe_layers(self, start: int, stop: int) -> int:
        """MoE layers among ``start <= layer < stop``, in closed form (no loop over layers).

        >>> ModelSpec(name="x", family="gpt", hidden_size=8, ffn_hidden_size=8, num_layers=10,
        ...     num_heads=1, num_kv_heads=1, head_dim=8, vocab_size=8, max_position_embeddings=8,
        ...     tie_embeddings=True, gated_mlp=False, norm="layernorm", position="learned", bias=False,
        ...     dropout=0.0, num_experts=4, moe_top_k=1, moe_ffn_hidden_size=8, moe_layer_freq=2,
        ...     moe_first_dense_layers=1).count_moe_layers(0, 10)  # layers 1, 3, 5, 7, 9
        5
        """
        if not self.is_moe:
            return 0
        f, k = self.moe_first_dense_layers, self.moe_layer_freq
        lo = max(start, f)
        first = f + -(-(lo - f) // k) * k
        return 0 if first >= stop else (stop - 1 - first) // k + 1

    @property
    def num_moe_layers(self) -> int:
        return self.count_moe_layers(0, self.num_layers)

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    # ---- parameter counts (elements) ---------------------------------------------------
    @property
    def attention_params(self) -> int:
        """QKV and output projection (+ biases): h(q + 2kv) + q h."""
        h = self.hidden_size
        bias = (self.q_width + 2 * self.kv_width + h) if self.bias else 0
        return h * (self.q_width + 2 * self.kv_width) + self.q_width * h + bias

    @property
    def norm_params(self) -> int:
        """Two norms per layer; LayerNorm has a bias as well as a scale."""
        return 2 * self.hidden_size * (2 if self.norm == "layernorm" else 1)

    @property
    def tp_replicated_layer_params(self) -> int:
        """Per-layer parameters every TP rank keeps whole: the norms and the biases of the two
        row-parallel projections (attention output, MLP down), added after the reduction."""
        return self.norm_params + (2 * self.hidden_size if self.bias else 0)

    def mlp_params(self, width: int) -> int:
        bias = (width * (self.mlp_matrices - 1) + self.hidden_size) if self.bias else 0
        return self.mlp_matrices * self.hidden_size * width + bias

    @property
    def dense_layer_params(self) -> int:
        return self.attention_params + self.norm_params + self.mlp_params(self.ffn_hidden_size)

    @property
    def expert_params(self) -> int:
        """Parameters of all routed experts of one MoE layer."""
        return self.num_experts * self.mlp_params(self.moe_ffn_hidden_size)

    @property
    def moe_layer_nonexpert_params(self) -> int:
        """Attention, norms, router and shared expert of one MoE layer."""
        shared = self.mlp_params(self.moe_shared_ffn_hidden_size) if self.moe_shared_ffn_hidden_size else 0
        return self.attention_params + self.norm_params + self.hidden_size * self.num_experts + shared

    @property
    def embedding_params(self) -> int:
        """Word embeddings (+ learned positions)."""
        pos = self.max_position_embeddings * self.hidden_size if self.position == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    @property
    def head_params(self) -> int:
        """Final norm plus an untied output layer."""
        norm = self.hidden_size * (2 if self.norm == "layernorm" else 1)
        return norm + (0 if self.tie_embeddings else self.vocab_size * self.hidden_size)

    @property
    def num_params(self) -> int:
        moe = self.num_moe_layers
        dense = self.num_layers - moe
        return (
            dense * self.dense_layer_params
            + moe * (self.moe_layer_nonexpert_params + self.expert_params)
            + self.embedding_params
            + self.head_params
        )

    @property
    def active_params(self) -> int:
        """Parameters one token touches (routed experts counted top_k times, not num_experts)."""
        unused = (self.num_experts - self.moe_top_k) * self.mlp_params(self.moe_ffn_hidden_size)
        return self.num_params - self.num_moe_layers * unused
