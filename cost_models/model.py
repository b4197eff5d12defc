"""ModelSpec: the shape of a decoder-only transformer (dense or mixture-of-experts).

GPT-style (Megatron GPT, GPT-3): multi-head attention, 2-matrix GELU MLP, LayerNorm with
biases, learned positions, dropout. Llama-style: grouped-query attention, 3-matrix SwiGLU MLP,
RMSNorm, rotary positions, no biases, no dropout. Nemotron-style: squared-ReLU 2-matrix MLP,
LayerNorm, rotary positions, no biases, no dropout, a 256K vocabulary. MoE layers replace the MLP with ``num_experts``
expert MLPs of width ``moe_ffn_hidden_size`` of which each token visits ``moe_top_k``.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from topologies.bounds import Bound, bounds_validator
from topologies.errors import InputError

MAX_LAYERS = 10_000
"""Most transformer layers a model may have: the deepest trained ones have about 1,000 (DeepNet);
the per-layer search and the pipeline split walk every layer."""
_WIDTH = Bound(1, 2**22, "elements", "published models reach 18,432 wide, 73,728 in the MLP (Nemotron-4 340B)")
_OPTIONAL_WIDTH = _WIDTH._replace(lo=0)
_HEADS = Bound(1, 65_536, "heads", "the largest published models have 128 to 256 heads")
_BOUNDS: dict[str, Bound] = {
    "hidden_size": _WIDTH,
    "ffn_hidden_size": _WIDTH,
    "num_layers": Bound(1, MAX_LAYERS, "layers", "the deepest trained transformers have about 1,000 layers"),
    "num_heads": _HEADS,
    "num_kv_heads": _HEADS,
    "head_dim": Bound(1, 65_536, "elements", "published heads are 64 to 256 wide"),
    "vocab_size": Bound(1, 2**24, "tokens", "the largest vocabularies hold about 256,000 tokens"),
    "max_position_embeddings": Bound(1, 10**9, "tokens", "the longest contexts trained are about 10**7 tokens"),
    "num_experts": Bound(0, 65_536, "experts", "the largest MoE models have 256 (DeepSeek-V3) to 384 experts"),
    "moe_top_k": Bound(0, 65_536, "experts", "tokens visit 1 to 8 experts in published MoE models"),
    "moe_ffn_hidden_size": _OPTIONAL_WIDTH,
    "moe_layer_freq": Bound(1, MAX_LAYERS, "layers", "every k-th layer is MoE, so k is at most the layer count"),
    "moe_first_dense_layers": Bound(0, MAX_LAYERS, "layers", "they are a prefix of the model's layers"),
    "moe_shared_ffn_hidden_size": _OPTIONAL_WIDTH,
    "q_lora_rank": _OPTIONAL_WIDTH,
    "kv_lora_rank": _OPTIONAL_WIDTH,
    "qk_rope_head_dim": Bound(0, 65_536, "elements", "published heads are 64 to 256 wide"),
    "qk_nope_head_dim": Bound(0, 65_536, "elements", "published heads are 64 to 256 wide"),
    "v_head_dim": Bound(0, 65_536, "elements", "published heads are 64 to 256 wide"),
    "mtp_layers": Bound(0, 64, "layers", "DeepSeek-V3 predicts 1 extra token; a few at most are trained"),
    "sliding_window": Bound(0, 10**9, "tokens", "published windows are 128 (GPT-OSS) to 8,192 tokens (Llama 4)"),
    "full_attention_every": Bound(0, MAX_LAYERS, "layers", "every k-th layer attends in full, so k <= layers"),
}


class LayerKind(NamedTuple):
    """What makes one transformer layer cost differently from another."""

    moe: bool  # the MLP is a mixture of experts
    ffn: int  # dense MLP width (0 = no MLP); ignored for MoE layers
    attention: bool  # the layer has self-attention
    window: int = 0  # sliding-window attention: tokens each query sees back (0 = full causal attention)


class LayerOverride(BaseModel):
    """Per-layer deviations from the model's defaults (pruned or hybrid models)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layers: tuple[int, ...] = Field(
        min_length=1, max_length=MAX_LAYERS, description="0-based indices of the layers it applies to."
    )
    ffn_hidden_size: int | None = Field(default=None, ge=0, description="Dense MLP width; 0 removes the MLP.")
    attention: bool = Field(default=True, description="False removes self-attention from these layers.")

    _bounds = bounds_validator({"ffn_hidden_size": _OPTIONAL_WIDTH})


class YarnScaling(BaseModel):
    """YaRN rotary scaling (Peng et al. 2023, arXiv 2309.00071) as HuggingFace's ``rope_scaling``
    with ``rope_type: "yarn"`` holds it (GPT-OSS, DeepSeek-V3, Qwen3 past 32K). It changes which
    frequencies the rotation turns and scales the rotated queries and keys, never the FLOPs: the
    cost model charges the rotation alone (``TrainingSpec.rope_fusion``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    factor: float = Field(
        gt=1, le=1024, description="Context extension s: positions stretch s-fold (GPT-OSS: 32, DeepSeek-V3: 40)."
    )
    original_max_position_embeddings: int = Field(
        ge=1, le=10**9, description="Context the model was pretrained for before the stretch (both: 4,096 tokens)."
    )
    beta_fast: float = Field(
        default=32.0, gt=0, le=1e6, description="Rotations over the pretrained context above which a frequency is "
        "kept as is (extrapolated); HF's default 32."
    )  # fmt: skip
    beta_slow: float = Field(
        default=1.0, gt=0, le=1e6, description="Rotations below which a frequency is divided by factor "
        "(interpolated); between the two a linear ramp; HF's default 1."
    )  # fmt: skip
    mscale: float | None = Field(
        default=None, gt=0, le=1e3, description="DeepSeek's attention scale: with mscale_all_dim, queries and keys "
        "scale by (0.1 m ln s + 1) / (0.1 m_all ln s + 1); None = by 0.1 ln s + 1 (HF's default)."
    )  # fmt: skip
    mscale_all_dim: float | None = Field(
        default=None, gt=0, le=1e3, description="DeepSeek's m_all (DeepSeek-V3: 1, with mscale 1); given with "
        "mscale or not at all."
    )  # fmt: skip
    truncate: bool = Field(
        default=True, description="The ramp's ends rounded to whole dimensions (HF's default); GPT-OSS: false "
        "(Megatron's yarn_correction_range_round_to_int)."
    )  # fmt: skip

    @model_validator(mode="after")
    def _check(self) -> YarnScaling:
        if self.beta_slow >= self.beta_fast:
            raise InputError(
                f"YaRN's beta_slow({self.beta_slow}) must be below beta_fast({self.beta_fast}): frequencies between "
                "them are ramped from interpolated to kept"
            )
        if (self.mscale is None) != (self.mscale_all_dim is None):
            raise InputError(
                f"YaRN's mscale({self.mscale}) and mscale_all_dim({self.mscale_all_dim}) scale attention as a "
                "ratio: give both or neither"
            )
        return self


class ModelSpec(BaseModel):
    """What is trained. Sizes are element counts; derived sizes are properties."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=255, description="Catalogue name or file stem.")
    family: Literal["gpt", "llama", "nemotron"] = Field(description="Architecture family, for display.")
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
    q_lora_rank: int = Field(
        default=0, ge=0, description="MLA: rank of the query down-projection; 0 = queries projected directly."
    )
    kv_lora_rank: int = Field(
        default=0, ge=0, description="MLA (multi-head latent attention): rank of the joint KV latent; 0 = not MLA."
    )
    qk_rope_head_dim: int = Field(default=0, ge=0, description="MLA: rotary part of each query/key head.")
    qk_nope_head_dim: int = Field(default=0, ge=0, description="MLA: non-rotary part of each query/key head.")
    v_head_dim: int = Field(default=0, ge=0, description="MLA: width of each value head.")
    mtp_layers: int = Field(
        default=0, ge=0, description="Multi-token prediction modules after the last layer (DeepSeek-V3: 1)."
    )
    sliding_window: int = Field(
        default=0, ge=0, description="Tokens a windowed attention layer sees back (0 = every layer full)."
    )
    full_attention_every: int = Field(
        default=1,
        ge=0,
        description="With a sliding window: layer i attends in full when (i + 1) % k == 0, the others "
        "through the window (GPT-OSS: 2; 0 = every layer windowed).",
    )
    attention_sinks: bool = Field(default=False, description="A learned sink logit per head (GPT-OSS).")
    # What the model computes but the cost model does not need: the exports carry them, so the
    # framework builds the model its authors wrote (None: the framework's default, unstated).
    rope_theta: float | None = Field(
        default=None, ge=1, le=1e12, allow_inf_nan=False, description="Rotary base (Llama 3: 500,000)."
    )
    rope_scaling_factor: float | None = Field(
        default=None,
        gt=1,
        le=1024,
        allow_inf_nan=False,
        description="Llama 3.1-style rotary frequency scaling by this factor (HF rope_type 'llama3').",
    )
    yarn: YarnScaling | None = Field(
        default=None,
        description="YaRN rotary scaling (HF rope_type 'yarn': GPT-OSS, DeepSeek-V3); None = plain rotary.",
    )
    norm_eps: float | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False, description="Norm epsilon.")
    qkv_bias: bool = Field(default=False, description="Biases on the query/key/value projections only (Qwen2).")
    moe_aux_loss_coeff: float | None = Field(
        default=None, ge=0, le=10, allow_inf_nan=False, description="Load-balancing loss weight (Mixtral: 0.02)."
    )
    moe_router_score_function: Literal["softmax", "sigmoid"] = Field(
        default="softmax", description="Router scores: softmax, or sigmoid (DeepSeek-V3)."
    )
    gate_activation: Literal["silu", "gelu", "quick_gelu"] = Field(
        default="silu",
        description="A gated MLP's activation: SiLU (SwiGLU), GELU (GeGLU, Gemma) or quick GELU, x * sigmoid(1.702 x) "
        "(GPT-OSS); unused ungated.",
    )
    gate_linear_offset: float = Field(
        default=0.0,
        ge=-1e3,
        le=1e3,
        allow_inf_nan=False,
        description="Added to the up-projection before the gate multiplies it (GPT-OSS: 1, (up + 1) * act(gate)).",
    )
    activation_clamp: float | None = Field(
        default=None,
        gt=0,
        le=1e6,
        allow_inf_nan=False,
        description="A gated MLP clamps its gate to at most this and its up-projection to +-this (GPT-OSS: 7, "
        "its config's swiglu_limit); None = no clamp.",
    )
    mlp_activation: Literal["gelu", "squared_relu"] = Field(
        default="gelu",
        description="An ungated MLP's activation: GELU (GPT) or squared ReLU, relu(x)**2 (Nemotron); unused gated.",
    )
    qk_norm: bool = Field(
        default=False,
        description="Queries and keys normalised per head before attention, a norm of head_dim weights each "
        "(Qwen3, Gemma 3).",
    )
    qk_norm_span: Literal["head", "projection"] = Field(
        default="head",
        description="What a query/key norm (``qk_norm``) spans: one head, its head_dim weights shared by every head "
        "(Qwen3, Gemma 3), or the whole query and key projections, num_heads x head_dim and num_kv_heads x "
        "head_dim weights (OLMo 2).",
    )
    qk_l2_norm: bool = Field(
        default=False,
        description="Queries and keys L2-normalised per head after the rotation, with no weights (Llama 4 Scout's "
        "use_qk_norm).",
    )
    norm_zero_centered: bool = Field(
        default=False,
        description="Norm weights stored as offsets from 1, the norm scaling by (1 + w): Nemotron's layernorm1p, "
        "Gemma's RMSNorm (Megatron's layernorm_zero_centered_gamma); the same parameters either way.",
    )
    rotary_fraction: float = Field(
        default=1.0,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="Share of each query/key head the rotary embedding turns (Nemotron: 0.5, GPT-NeoX's rotary_pct, "
        "Phi's partial_rotary_factor); 1 with learned positions.",
    )
    nope_every: int = Field(
        default=0,
        ge=0,
        le=MAX_LAYERS,
        description="Every k-th layer, i with (i + 1) % k == 0, attends without rotary positions (Llama 4: 4, its "
        "NoPE layers, which skip its L2 query/key norm too); 0 = every layer rotates.",
    )
    moe_router_expert_bias: bool = Field(
        default=False, description="Aux-loss-free balancing: a per-expert bias on the routing scores (DeepSeek-V3)."
    )
    post_norms: bool = Field(
        default=False,
        description="Attention's and the MLP's outputs are normalised too before the residual add (Gemma 2, 3): "
        "four norms a layer, not two.",
    )
    attention_softcap: float | None = Field(
        default=None, gt=0, le=1e6, allow_inf_nan=False, description="Attention logits capped to c tanh(x / c) "
        "(Gemma 2: 50); None = uncapped."
    )  # fmt: skip
    final_softcap: float | None = Field(
        default=None, gt=0, le=1e6, allow_inf_nan=False, description="Output logits capped likewise (Gemma 2: 30)."
    )
    layer_overrides: tuple[LayerOverride, ...] = Field(
        default=(), description="Layers that differ from the defaults (later entries win)."
    )

    _bounds = bounds_validator(_BOUNDS)

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.num_heads % self.num_kv_heads:
            raise InputError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.num_experts:
            if not 0 < self.moe_top_k <= self.num_experts:
                raise InputError(f"moe_top_k ({self.moe_top_k}) must be in 1..num_experts ({self.num_experts})")
            if self.moe_ffn_hidden_size <= 0:
                raise InputError("an MoE model needs moe_ffn_hidden_size > 0")
        self._check_mla()
        if self.qk_norm and self.is_mla:
            raise InputError(
                "qk_norm normalises each query and key head; MLA (kv_lora_rank > 0) normalises its latents instead "
                "(counted with it): leave qk_norm false"
            )
        if not self.gated_mlp and (self.activation_clamp is not None or self.gate_linear_offset):
            raise InputError(
                "activation_clamp and gate_linear_offset shape a gated MLP's gate and up-projection, and this MLP "
                "is not gated (gated_mlp false): leave them out or make the MLP gated"
            )
        self._check_window()
        self._check_qk_and_rotary()
        for o in self.layer_overrides:
            bad = [i for i in o.layers if not 0 <= i < self.num_layers]
            if bad:
                raise InputError(f"layer_overrides name layers {bad[:5]} outside 0..{self.num_layers - 1}")
            if o.ffn_hidden_size is not None and any(self.is_moe_layer(i) for i in o.layers):
                raise InputError("ffn_hidden_size overrides apply to dense layers; these include MoE layers")
        return self

    def _check_mla(self) -> None:
        mla_dims = {
            "q_lora_rank": self.q_lora_rank,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "v_head_dim": self.v_head_dim,
        }
        if not self.is_mla:
            set_dims = [f"{k}({v})" for k, v in mla_dims.items() if v]
            if set_dims:
                raise InputError(
                    f"{', '.join(set_dims)} describe multi-head latent attention, which kv_lora_rank(0) turns off; "
                    "set kv_lora_rank > 0 or leave them 0"
                )
            return
        if self.qk_rope_head_dim <= 0 or self.v_head_dim <= 0:
            raise InputError(
                f"MLA (kv_lora_rank {self.kv_lora_rank}) needs qk_rope_head_dim({self.qk_rope_head_dim}) > 0 and "
                f"v_head_dim({self.v_head_dim}) > 0: the key's rotary part and the value heads"
            )
        if self.head_dim != self.qk_nope_head_dim + self.qk_rope_head_dim:
            raise InputError(
                f"MLA query/key heads are qk_nope_head_dim({self.qk_nope_head_dim}) + qk_rope_head_dim"
                f"({self.qk_rope_head_dim}) = {self.qk_nope_head_dim + self.qk_rope_head_dim} wide, but head_dim is "
                f"{self.head_dim}; set head_dim to their sum"
            )
        if self.num_kv_heads != self.num_heads:
            raise InputError(
                f"MLA up-projects a key and a value per query head: num_kv_heads({self.num_kv_heads}) must equal "
                f"num_heads({self.num_heads})"
            )
        if self.position != "rope":
            raise InputError("MLA splits each head into a rotary and a non-rotary part: position must be 'rope'")

    def _check_qk_and_rotary(self) -> None:
        if self.qk_norm_span != "head" and not self.qk_norm:
            raise InputError(
                f"qk_norm_span({self.qk_norm_span!r}) says what the query/key norms span, and qk_norm is false: "
                "set qk_norm true or leave qk_norm_span out"
            )
        if self.qk_l2_norm and self.qk_norm:
            raise InputError(
                "qk_l2_norm (Llama 4's weightless L2 norm) and qk_norm (a weighted norm) both normalise queries and "
                "keys; set one of them"
            )
        if self.nope_every and (self.position != "rope" or self.nope_every > self.num_layers):
            raise InputError(
                f"nope_every({self.nope_every}) picks the layers without rotary positions among num_layers"
                f"({self.num_layers}) rotary ones (position {self.position!r}): set position 'rope' and k <= layers, "
                "or leave nope_every 0"
            )
        if self.yarn is not None and (self.position != "rope" or self.rope_scaling_factor is not None):
            raise InputError(
                f"yarn scales rotary positions, and position is {self.position!r} with rope_scaling_factor "
                f"{self.rope_scaling_factor} (Llama 3.1's scaling): set position 'rope' and one scaling, not both"
            )
        if self.rotary_fraction != 1 and self.position != "rope":
            raise InputError(
                f"rotary_fraction({self.rotary_fraction}) is the share of each head rotary positions turn, and "
                f"position is {self.position!r}: set position 'rope' or leave rotary_fraction 1"
            )

    def _check_window(self) -> None:
        w, k = self.sliding_window, self.full_attention_every
        if not w:
            if k != 1:
                raise InputError(
                    f"full_attention_every({k}) picks the full-attention layers among windowed ones; set "
                    "sliding_window > 0 or leave full_attention_every 1"
                )
            return
        if k == 1:
            raise InputError(
                f"sliding_window({w}) with full_attention_every(1) leaves every layer in full attention; set "
                "full_attention_every to k > 1 (layer i full when (i + 1) % k == 0) or 0 (every layer windowed)"
            )
        if k > self.num_layers:
            raise InputError(
                f"full_attention_every({k}) > num_layers({self.num_layers}) makes no layer full attention; "
                "write 0 for that"
            )
        if w >= self.max_position_embeddings:
            raise InputError(
                f"sliding_window({w}) >= max_position_embeddings({self.max_position_embeddings}): the window never "
                "binds; set sliding_window 0"
            )

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
    def is_mla(self) -> bool:
        """Attention is multi-head latent attention (DeepSeek-V2/V3)."""
        return self.kv_lora_rank > 0

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

    def attention_window(self, layer: int) -> int:
        """Tokens layer ``layer`` attends back through a sliding window; 0 = full attention.
        GPT-OSS (window 128, full_attention_every 2): layers 0, 2, 4, ... windowed, 1, 3, ... full."""
        k = self.full_attention_every
        if not self.sliding_window or (k and (layer + 1) % k == 0):
            return 0
        return self.sliding_window

    def layer_kind(self, layer: int) -> LayerKind:
        """The kind of layer ``layer`` after overrides."""
        ffn, attention = self.ffn_hidden_size, True
        for o in self.layer_overrides:
            if layer in o.layers:
                ffn = o.ffn_hidden_size if o.ffn_hidden_size is not None else ffn
                attention = o.attention
        return LayerKind(self.is_moe_layer(layer), ffn, attention, self.attention_window(layer) if attention else 0)

    def kind_counts(self, start: int, stop: int) -> dict[LayerKind, int]:
        """How many layers of each kind lie in ``start <= layer < stop``. Closed form for models
        without overrides or sliding windows (the search asks this for every stage of every layout)."""
        if self.layer_overrides or self.sliding_window:
            return dict(Counter(self.layer_kind(i) for i in range(start, stop)))
        moe = self.count_moe_layers(start, stop)
        counts = {
            LayerKind(True, self.ffn_hidden_size, True): moe,
            LayerKind(False, self.ffn_hidden_size, True): stop - start - moe,
        }
        return {k: n for k, n in counts.items() if n}

    @property
    def kinds(self) -> list[LayerKind]:
        """Distinct layer kinds, in order of first appearance."""
        return list(dict.fromkeys(self.layer_kind(i) for i in range(self.num_layers)))

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
        """QKV and output projection (+ biases): h(q + 2kv) + q h; MLA's projections instead
        (``mla_params``); attention sinks add one logit per head."""
        sinks = self.num_heads if self.attention_sinks else 0
        if self.is_mla:
            return self.mla_params + sinks
        h = self.hidden_size
        bias = (self.q_width + 2 * self.kv_width + h) if self.bias else 0
        bias += (self.q_width + 2 * self.kv_width) if self.qkv_bias and not self.bias else 0
        return h * (self.q_width + 2 * self.kv_width) + self.q_width * h + bias + sinks + self.qk_norm_params

    @property
    def qk_norm_params(self) -> int:
        """The query and key norms of one layer (``qk_norm``): per head, two norms of head_dim shared
        by every head (Qwen3: 2 x 128 = 256 weights a layer); over the whole projections, norms of
        the query and key widths (OLMo 2 7B: 4096 + 4096 = 8,192 a layer). A LayerNorm doubles
        either with its bias; Llama 4's L2 norm (``qk_l2_norm``) has no weights."""
        if not self.qk_norm:
            return 0
        width = 2 * self.head_dim if self.qk_norm_span == "head" else self.q_width + self.kv_width
        return self._norm_size(width)

    @property
    def mla_down_params(self) -> int:
        """MLA's down-projections and the norms of their latents (DeepSeek-V2, arXiv 2405.04434,
        eqs. 9-13): queries h -> q_lora_rank (+ its RMSNorm), keys and values jointly h ->
        kv_lora_rank + qk_rope_head_dim (the shared rotary key rides along) (+ an RMSNorm of the
        kv_lora_rank latent). Megatron-Core keeps them whole on every TP rank
        (``MLASelfAttention``: TELinear with ``parallel_mode='duplicated'``)."""
        h, q, kv = self.hidden_size, self.q_lora_rank, self.kv_lora_rank + self.qk_rope_head_dim
        bias = (q + kv) if self.bias else 0
        return h * q + q + h * kv + self.kv_lora_rank + bias

    @property
    def mla_params(self) -> int:
        """All MLA parameters of one layer: the down-projections (``mla_down_params``), the
        up-projections q_lora_rank -> a (nope + rope) (or h -> a (nope + rope) with no query
        latent) and kv_lora_rank -> a (nope + v), and the output a v -> h (+ its bias).
        DeepSeek-V3: 11.0M + 4.1M down, 37.7M + 16.8M up, 117.4M out = 187.1M per layer."""
        h, a = self.hidden_size, self.num_heads
        q_in = self.q_lora_rank or h
        up = q_in * a * self.head_dim + self.kv_lora_rank * a * (self.qk_nope_head_dim + self.v_head_dim)
        q_bias = a * self.head_dim if self.bias and not self.q_lora_rank else 0
        out = a * self.v_head_dim * h + (h if self.bias else 0)
        return self.mla_down_params + up + q_bias + out

    @property
    def norm_params(self) -> int:
        """Two norms per layer (four with ``post_norms``); LayerNorm has a bias as well as a scale."""
        return 2 * self._block_norm_size()

    @property
    def tp_replicated_layer_params(self) -> int:
        """Per-layer parameters every TP rank keeps whole: the norms (the per-head query/key norms
        too) and the biases of the two row-parallel projections (attention output, MLP down),
        added after the reduction."""
        return self.norm_params + self._qk_norm_replicated + (2 * self.hidden_size if self.bias else 0)

    @property
    def _qk_norm_replicated(self) -> int:
        """The query/key norms every TP rank keeps whole: per-head ones (each rank's heads share
        them); norms spanning the whole projections split with the projections' columns."""
        return self.qk_norm_params if self.qk_norm_span == "head" else 0

    def mlp_params(self, width: int) -> int:
        bias = (width * (self.mlp_matrices - 1) + self.hidden_size) if self.bias else 0
        return self.mlp_matrices * self.hidden_size * width + bias

    @property
    def dense_layer_params(self) -> int:
        return self.attention_params + self.norm_params + self.mlp_params(self.ffn_hidden_size)

    def _norm_size(self, width: int | None = None) -> int:
        """One norm over ``width`` features (hidden_size unless given): LayerNorm's bias doubles it."""
        return (self.hidden_size if width is None else width) * (2 if self.norm == "layernorm" else 1)

    def _block_norm_size(self) -> int:
        """The norms of one block (attention or MLP): before it, and after it with ``post_norms``."""
        return self._norm_size() * (2 if self.post_norms else 1)

    def layer_params(self, kind: LayerKind) -> int:
        """All parameters of one layer of ``kind`` (every expert included)."""
        has_mlp = kind.moe or kind.ffn > 0
        total = (kind.attention + has_mlp) * self._block_norm_size()
        total += self.attention_params if kind.attention else 0
        if kind.moe:
            total += self.moe_layer_nonexpert_params - self.attention_params - self.norm_params + self.expert_params
        elif kind.ffn:
            total += self.mlp_params(kind.ffn)
        return total

    def layer_expert_params(self, kind: LayerKind) -> int:
        """Routed-expert parameters of one layer (split over ep as well as tp)."""
        return self.expert_params if kind.moe else 0

    def layer_tp_replicated_params(self, kind: LayerKind) -> int:
        """Parameters every TP rank keeps whole: norms, the biases of row-parallel
        projections (attention output, MLP down), added after the reduction, MLA's
        down-projections with their latent norms and the per-head query/key norms."""
        has_mlp = kind.moe or kind.ffn > 0
        bias = (kind.attention + has_mlp) * self.hidden_size if self.bias else 0
        attention = (self._mla_replicated + self._qk_norm_replicated) if kind.attention else 0
        return (kind.attention + has_mlp) * self._block_norm_size() + bias + attention

    @property
    def _mla_replicated(self) -> int:
        """MLA's down-projections and latent norms (``mla_down_params``; without a query latent
        only the joint KV one: the query projection is then column-parallel)."""
        return self.mla_down_params if self.is_mla else 0

    @property
    def expert_params(self) -> int:
        """Parameters of all routed experts of one MoE layer."""
        return self.num_experts * self.mlp_params(self.moe_ffn_hidden_size)

    @property
    def router_params(self) -> int:
        """One MoE layer's router: a weight row per expert, and with biased linear layers a bias per
        expert (GPT-OSS: HF's GptOssTopKRouter; megatron-core's TopKRouter with add_bias_linear)."""
        return self.num_experts * (self.hidden_size + (1 if self.bias else 0))

    @property
    def moe_layer_nonexpert_params(self) -> int:
        """Attention, norms, router and shared expert of one MoE layer."""
        shared = self.mlp_params(self.moe_shared_ffn_hidden_size) if self.moe_shared_ffn_hidden_size else 0
        return self.attention_params + self.norm_params + self.router_params + shared

    @property
    def embedding_params(self) -> int:
        """Word embeddings (+ learned positions)."""
        pos = self.max_position_embeddings * self.hidden_size if self.position == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    @property
    def head_params(self) -> int:
        """Final norm plus an untied output layer."""
        return self._norm_size() + (0 if self.tie_embeddings else self.vocab_size * self.hidden_size)

    @property
    def num_params(self) -> int:
        layers = sum(n * self.layer_params(k) for k, n in self.kind_counts(0, self.num_layers).items())
        return layers + self.embedding_params + self.head_params

    @property
    def active_params(self) -> int:
        """Parameters one token touches (routed experts counted top_k times, not num_experts)."""
        unused = (self.num_experts - self.moe_top_k) * self.mlp_params(self.moe_ffn_hidden_size)
        return self.num_params - self.num_moe_layers * unused

    # ---- multi-token prediction (DeepSeek-V3, arXiv 2412.19437 section 2.2) -------------
    @property
    def mtp_layer_kind(self) -> LayerKind:
        """The transformer layer of each MTP module: the kind the layer pattern gives layer
        ``num_layers`` (DeepSeek-V3's module is an MoE layer, checkpoint layer 61)."""
        return self.layer_kind(self.num_layers)

    @property
    def mtp_module_params(self) -> int:
        """One MTP module's own parameters: RMSNorms of the hidden state and of the next token's
        embedding, their projection 2h -> h, one transformer layer and the module's final norm.
        The embedding and output head are shared with the main model (paper section 2.2) and not
        counted here; DeepSeek-V3's checkpoint stores copies of both in the module (its "14B")."""
        h = self.hidden_size
        return self.layer_params(self.mtp_layer_kind) + 2 * h * h + 3 * self._norm_size()

    @property
    def mtp_params(self) -> int:
        return self.mtp_layers * self.mtp_module_params

    # ---- published parameter counts ----------------------------------------------------
    @property
    def params_total(self) -> int:
        """Every parameter of the main model, embeddings and output layer included (one copy
        when tied), every expert included, the MTP modules left out: the figure model cards
        publish (DeepSeek-V3 671B; its 685B checkpoint adds the MTP module with its copies of the
        embedding and output head)."""
        return self.num_params

    @property
    def params_active(self) -> int:
        """Parameters one token's forward touches: attention, dense MLPs, the router, the shared
        expert and ``moe_top_k`` routed experts of each MoE layer, the norms, the embedding matrix
        and the output layer, MTP modules left out. The convention of the DeepSeek-V3 (37B),
        Qwen3 (3.3B, 22B), Llama 4 (17B) and Mixtral (12.9B, 39B) model cards; OpenAI's GPT-OSS card
        counts the unembedding but not the embedding (5.1B = this minus vocab_size x hidden_size)."""
        return self.active_params
