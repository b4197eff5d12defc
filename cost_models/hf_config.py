"""Read a model from a HuggingFace-style ``config.json`` (or a YAML file with the same keys).

Key meanings follow HuggingFace transformers: ``hidden_act`` "silu"/"swiglu" means a gated
3-matrix MLP, anything else (gelu, gelu_new, relu) a plain 2-matrix MLP; ``head_dim`` wins over
hidden/heads when present; multimodal files nest the text model under ``text_config``. MoE keys:
Mixtral (num_local_experts, num_experts_per_tok), Qwen-MoE (num_experts, moe_intermediate_size,
decoder_sparse_step, mlp_only_layers, shared_expert_intermediate_size), DeepSeek
(n_routed_experts, first_k_dense_replace, n_shared_experts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cost_models.model import ModelSpec
from topologies.cluster_catalogue import first_error
from topologies.files import read_mapping

REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_GATED_ACTS = {"silu", "swiglu", "swish"}


def load_model_file(path: Path) -> ModelSpec:
    data = read_mapping(path, "model file")
    return model_from_hf_config(data, name=path.parent.name if path.stem == "config" else path.stem, where=str(path))


def model_from_hf_config(cfg: dict[str, Any], name: str, where: str = "config") -> ModelSpec:
    """Translate HuggingFace config keys into a ModelSpec; name missing keys in one sentence."""
    cfg = {**cfg, **cfg.get("text_config", {})}
    missing = [k for k in REQUIRED if k not in cfg]
    if "intermediate_size" not in cfg and "moe_intermediate_size" not in cfg:
        missing.append("intermediate_size")
    if missing:
        raise ValueError(f"{where} lacks required key(s) {', '.join(missing)}; add them (see HuggingFace config.json).")
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    act = str(cfg.get("hidden_act", cfg.get("activation_function", "silu"))).lower()
    gated = act in _GATED_ACTS
    rms = "rms_norm_eps" in cfg or "layer_norm_eps" not in cfg and "layer_norm_epsilon" not in cfg
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0)
    moe: dict[str, Any] = {}
    if experts:
        moe = dict(
            num_experts=experts,
            moe_top_k=int(cfg.get("num_experts_per_tok", 2)),
            moe_ffn_hidden_size=int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]),
            moe_layer_freq=int(cfg.get("decoder_sparse_step", cfg.get("moe_layer_freq", 1)) or 1),
            moe_first_dense_layers=int(cfg.get("first_k_dense_replace", 0)),
            moe_shared_ffn_hidden_size=int(
                cfg.get("shared_expert_intermediate_size")
                or int(cfg.get("n_shared_experts") or 0) * int(cfg.get("moe_intermediate_size") or 0)
            ),
        )
    try:
        return ModelSpec(
            name=name,
            family="llama" if gated else "gpt",
            hidden_size=hidden,
            ffn_hidden_size=int(cfg.get("intermediate_size") or cfg.get("moe_intermediate_size")),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            vocab_size=int(cfg["vocab_size"]),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", not gated)),
            gated_mlp=gated,
            norm="rmsnorm" if rms else "layernorm",
            position="rope" if "rope_theta" in cfg or gated else "learned",
            bias=bool(cfg.get("attention_bias", cfg.get("bias", not gated))),
            dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
            **moe,
        )
    except (ValidationError, TypeError) as exc:
        detail = first_error(exc) if isinstance(exc, ValidationError) else str(exc)
        raise ValueError(f"{where}: {detail}") from None
