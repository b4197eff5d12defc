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

from cost_models.model import ModelSpec
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
        _llama("llama3-8b", 4096, 14336, 32, 32, 8, 128256, 8192),
        _llama("llama3-70b", 8192, 28672, 80, 64, 8, 128256, 8192),
        _llama("llama3.1-405b", 16384, 53248, 126, 128, 8, 128256, 131072),
        _llama(
            "mixtral-8x7b", 4096, 14336, 32, 32, 8, 32000, 32768, num_experts=8, moe_top_k=2, moe_ffn_hidden_size=14336
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
