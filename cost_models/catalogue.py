"""Built-in models, as data: one dict of shape numbers per model, expanded by family defaults.

Sources: Llama 3 shapes from Meta's released config.json files (and arXiv 2407.21783 Table 3);
Llama 2 from its config.json files (arXiv 2307.09288); GPT-3 from Brown et al. 2020 Table 2.1
with Megatron's padded vocabulary 51,200, its 5B and 20B sizes from NeMo's GPTConfig5B /
GPTConfig20B; Nemotron-3 8B/22B and Nemotron-4 15B/340B from NeMo's ``nemotron.py`` configs
(squared-ReLU MLP, 256K vocabulary, arXiv 2406.11704); Mixtral and DeepSeekMoE 16B from their
config.json files; the Megatron family from Narayanan et al. SC'21
Table 1 (shared/reference/calibration.md); ntp-480b from the NTP paper's simulated model
(shared/reference/ntp.md), whose vocabulary the paper does not state: we use Megatron GPT's 51,200.
"""

from __future__ import annotations

from pathlib import Path

from cost_models.model import ModelSpec, YarnScaling
from topologies.naming import lookup

_GPT = dict(
    family="gpt",
    gated_mlp=False,
    norm="layernorm",
    position="learned",
    bias=True,
    dropout=0.1,
    tie_embeddings=True,
    vocab_size=51200,
    max_position_embeddings=2048,
)
_LLAMA = dict(
    family="llama", gated_mlp=True, norm="rmsnorm", position="rope", bias=False, dropout=0.0, tie_embeddings=False
)


def _gpt(name: str, hidden: int, layers: int, heads: int, **kw) -> ModelSpec:
    fields = {**_GPT, **kw}
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        ffn_hidden_size=4 * hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        **fields,
    )


_NEMOTRON = dict(
    family="nemotron",
    gated_mlp=False,
    norm="layernorm",
    position="rope",
    bias=False,
    dropout=0.0,
    tie_embeddings=False,
    vocab_size=256000,
    max_position_embeddings=4096,
    mlp_activation="squared_relu",
    # NeMo's Nemotron configs and Megatron-Bridge's NemotronModelProvider: LayerNorm1P (weights as offsets
    # from 1, layernorm_zero_centered_gamma) and rotary positions on half of each head (rotary_percent 0.5),
    # as transformers' NemotronLayerNorm1P and NemotronConfig's partial_rotary_factor 0.5
    norm_zero_centered=True,
    rotary_fraction=0.5,
)


def _nemotron(name: str, hidden: int, ffn: int, layers: int, heads: int, kv: int) -> ModelSpec:
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        ffn_hidden_size=ffn,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=hidden // heads,
        **_NEMOTRON,
    )


def _llama(
    name: str, hidden: int, ffn: int, layers: int, heads: int, kv: int, vocab: int, max_pos: int, **kw
) -> ModelSpec:
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        ffn_hidden_size=ffn,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=hidden // heads,
        vocab_size=vocab,
        max_position_embeddings=max_pos,
        **{**_LLAMA, **kw},
    )


def _moe(
    name: str,
    hidden: int,
    ffn: int,
    layers: int,
    heads: int,
    kv: int,
    head_dim: int,
    vocab: int,
    max_pos: int,
    experts: int,
    top_k: int,
    expert_ffn: int,
    **kw,
) -> ModelSpec:
    """A Llama-style MoE model as its config.json states it (``head_dim`` given: it need not be h / a)."""
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        ffn_hidden_size=ffn,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        vocab_size=vocab,
        max_position_embeddings=max_pos,
        num_experts=experts,
        moe_top_k=top_k,
        moe_ffn_hidden_size=expert_ffn,
        **{**_LLAMA, **kw},
    )


# MoE models from their published config.json (the Hugging Face repos named), as (name, hidden, dense ffn,
# layers, heads, kv heads, head dim, vocab, max positions, experts, top-k, expert ffn, extras).
# DeepSeek-V3 (deepseek-ai/DeepSeek-V3): MLA (q_lora_rank 1536, kv_lora_rank 512, qk_nope 128 + qk_rope 64 = 192-wide
#   query/key heads, v_head_dim 128), first_k_dense_replace 3, n_shared_experts 1 of moe_intermediate_size 2048,
#   n_routed_experts 256 top-8, num_nextn_predict_layers 1 (arXiv 2412.19437).
# Qwen3 (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B): every layer MoE (decoder_sparse_step 1, mlp_only_layers []),
#   queries and keys RMS-normalised per head (Qwen3MoeAttention's q_norm, k_norm of head_dim).
# GPT-OSS (openai/gpt-oss-20b, -120b): biases on attention and experts, sliding_window 128 on the even layers
#   (layer_types alternate sliding / full, starting with sliding), one learned sink per head; experts gated
#   (up + 1) * gate * sigmoid(1.702 gate), gate clamped to <= 7 and up to +-7 (swiglu_limit; GptOssExperts).
# Llama 4 (meta-llama/Llama-4-Scout-17B-16E, -Maverick-17B-128E): text_config; a shared expert of intermediate_size
#   beside the routed ones; Maverick's interleave_moe_layer_step 2 makes layers 1, 3, ..., 47 MoE and the others dense
#   of intermediate_size_mlp. Chunked attention (attention_chunk_size 8192) equals full causal attention at the
#   pre-training sequence lengths (<= 8192), so it is not modelled. Every 4th layer has no rotary positions
#   (Llama4TextConfig's no_rope_layer_interval 4, its NoPE layers). Scout L2-normalises queries and keys in
#   the other layers (use_qk_norm true, no weights); Maverick does not (use_qk_norm false).
# Mixtral 8x22B (mistralai/Mixtral-8x22B-v0.1): 8 experts top-2.
# Model settings the exports carry (rope_theta, rms_norm_eps, rope_scaling, router_aux_loss_coef / aux_loss_alpha,
# scoring_func, topk_method in the same config.json files; Llama 3 from meta-llama/Meta-Llama-3-8B, -70B and
# Llama-3.1-405B, Mixtral 8x7B from mistralai/Mixtral-8x7B-v0.1). DeepSeek-V3 routes with sigmoid scores and a
# per-expert bias (topk_method "noaux_tc", arXiv 2412.19437 section 2.1.2); its sequence-wise balance loss (alpha
# 0.0001 in the paper) has no key in the config.json the catalogue follows, so it is left unset.
_LLAMA3 = dict(rope_theta=500000.0, norm_eps=1e-5)
_QWEN3 = dict(rope_theta=1e6, norm_eps=1e-6, moe_aux_loss_coeff=0.001, qk_norm=True)
# YaRN as their config.json files' rope_scaling has it (openai/gpt-oss-20b, -120b: factor 32 over 4,096 pretrained
# positions, truncate false; deepseek-ai/DeepSeek-V3: factor 40, mscale = mscale_all_dim = 1)
_OSS_YARN = YarnScaling(factor=32.0, original_max_position_embeddings=4096, truncate=False)
_DSV3_YARN = YarnScaling(factor=40.0, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=1.0)
_GPT_OSS = dict(
    yarn=_OSS_YARN,
    rope_theta=150000.0,
    norm_eps=1e-5,
    moe_aux_loss_coeff=0.9,
    gate_activation="quick_gelu",
    gate_linear_offset=1.0,
    activation_clamp=7.0,
)
_LLAMA4 = dict(
    rope_theta=500000.0, norm_eps=1e-5, moe_aux_loss_coeff=0.001, moe_router_score_function="sigmoid", nope_every=4
)
_DSV3_ROUTER = dict(
    yarn=_DSV3_YARN,
    rope_theta=10000.0,
    norm_eps=1e-6,
    moe_router_score_function="sigmoid",
    moe_router_expert_bias=True,
)
# fmt: off
_MOE_TABLE = [
    ("deepseek-v3", 7168, 18432, 61, 128, 128, 192, 129280, 163840, 256, 8, 2048,
     dict(moe_first_dense_layers=3, moe_shared_ffn_hidden_size=2048, q_lora_rank=1536, kv_lora_rank=512,
          qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, mtp_layers=1, **_DSV3_ROUTER)),
    ("qwen3-30b-a3b", 2048, 6144, 48, 32, 4, 128, 151936, 40960, 128, 8, 768, _QWEN3),
    ("qwen3-235b-a22b", 4096, 12288, 94, 64, 4, 128, 151936, 40960, 128, 8, 1536, _QWEN3),
    ("gpt-oss-20b", 2880, 2880, 24, 64, 8, 64, 201088, 131072, 32, 4, 2880,
     dict(bias=True, sliding_window=128, full_attention_every=2, attention_sinks=True, **_GPT_OSS)),
    ("gpt-oss-120b", 2880, 2880, 36, 64, 8, 64, 201088, 131072, 128, 4, 2880,
     dict(bias=True, sliding_window=128, full_attention_every=2, attention_sinks=True, **_GPT_OSS)),
    ("llama4-scout", 5120, 16384, 48, 40, 8, 128, 202048, 10485760, 16, 1, 8192,
     dict(moe_shared_ffn_hidden_size=8192, qk_l2_norm=True, **_LLAMA4)),
    ("llama4-maverick", 5120, 16384, 48, 40, 8, 128, 202048, 1048576, 128, 1, 8192,
     dict(moe_shared_ffn_hidden_size=8192, moe_layer_freq=2, moe_first_dense_layers=1, **_LLAMA4)),
    ("mixtral-8x22b", 6144, 16384, 56, 48, 8, 128, 32768, 65536, 8, 2, 16384,
     dict(rope_theta=1e6, norm_eps=1e-5, moe_aux_loss_coeff=0.001)),
]
# fmt: on

# Narayanan et al. SC'21 Table 1: (name, heads, hidden, layers)
_MEGATRON_FAMILY = [
    ("megatron-1.7b", 24, 2304, 24),
    ("megatron-3.6b", 32, 3072, 30),
    ("megatron-7.5b", 32, 4096, 36),
    ("megatron-18.4b", 48, 6144, 40),
    ("megatron-39.1b", 64, 8192, 48),
    ("megatron-76.1b", 80, 10240, 60),
    ("megatron-145.6b", 96, 12288, 80),
    ("megatron-310.1b", 128, 16384, 96),
    ("megatron-529.6b", 128, 20480, 105),
    ("megatron-1t", 160, 25600, 128),
]

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        _gpt("gpt3-175b", 12288, 96, 96),
        _gpt("gpt3-5b", 4096, 24, 32),
        _gpt("gpt3-20b", 6144, 44, 48),
        _llama("llama2-7b", 4096, 11008, 32, 32, 32, 32000, 4096),
        _llama("llama2-13b", 5120, 13824, 40, 40, 40, 32000, 4096),
        _llama("llama2-70b", 8192, 28672, 80, 64, 8, 32000, 4096),
        _nemotron("nemotron-8b", 4096, 16384, 32, 32, 32),
        _nemotron("nemotron-22b", 6144, 24576, 40, 48, 48),
        _nemotron("nemotron4-15b", 6144, 24576, 32, 48, 8),
        _nemotron("nemotron-340b", 18432, 73728, 96, 96, 8),
        _llama("llama3-8b", 4096, 14336, 32, 32, 8, 128256, 8192, **_LLAMA3),
        _llama("llama3-70b", 8192, 28672, 80, 64, 8, 128256, 8192, **_LLAMA3),
        _llama("llama3.1-405b", 16384, 53248, 126, 128, 8, 128256, 131072, **_LLAMA3, rope_scaling_factor=8.0),
        _llama(
            "mixtral-8x7b",
            4096,
            14336,
            32,
            32,
            8,
            32000,
            32768,
            num_experts=8,
            moe_top_k=2,
            moe_ffn_hidden_size=14336,
            rope_theta=1e6,
            norm_eps=1e-5,
            moe_aux_loss_coeff=0.02,
        ),
        # DeepSeekMoE 16B (arXiv 2401.06066, config.json): a dense first layer, then MoE layers of 64
        # fine-grained experts (top-6) plus 2 shared experts: layers of two kinds in one model.
        _llama(
            "deepseek-moe-16b",
            2048,
            10944,
            28,
            16,
            16,
            102400,
            4096,
            num_experts=64,
            moe_top_k=6,
            moe_ffn_hidden_size=1408,
            moe_first_dense_layers=1,
            moe_shared_ffn_hidden_size=2816,
        ),
        *[_moe(*row[:-1], **row[-1]) for row in _MOE_TABLE],
        *[_gpt(name, hidden, layers, heads) for name, heads, hidden, layers in _MEGATRON_FAMILY],
        _gpt("ntp-480b", 20480, 100, 128, max_position_embeddings=16384),
    ]
}


def resolve_model(name_or_path: str) -> ModelSpec:
    """A catalogue name, or a path to a HuggingFace ``config.json`` or a YAML file of its keys.
    A catalogue name wins over a file or folder of the same name in the working folder; write
    ``./llama3-8b`` for the file."""
    if name_or_path in MODELS:
        return MODELS[name_or_path]
    path = Path(name_or_path)
    if path.suffix in {".json", ".yaml", ".yml"} or path.exists():
        from cost_models.hf_config import load_model_file

        return load_model_file(path)
    return lookup(MODELS, name_or_path, "model", "Or give the path of a HuggingFace config.json.")
