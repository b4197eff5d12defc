"""Read a model from a HuggingFace-style ``config.json`` (or a YAML file with the same keys).

Key meanings follow HuggingFace transformers: ``hidden_act`` "silu"/"swiglu" means a gated
3-matrix MLP, anything else (gelu, gelu_new, relu) a plain 2-matrix MLP; ``head_dim`` wins over
hidden/heads when present; multimodal files nest the text model under ``text_config``. MoE keys:
Mixtral (num_local_experts, num_experts_per_tok), Qwen-MoE (num_experts, moe_intermediate_size,
decoder_sparse_step, mlp_only_layers, shared_expert_intermediate_size), DeepSeek
(n_routed_experts, first_k_dense_replace, n_shared_experts).

Every number is read strictly (a whole number for a count, a finite one for a probability) and
``ModelSpec`` checks its bounds; a refusal names the config key, not the ModelSpec field.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cost_models.model import ModelSpec
from topologies.errors import InputError
from topologies.files import read_mapping

REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_GATED_ACTS = {"silu", "swiglu", "swish"}
# ModelSpec field -> the config key it is read from, for messages
_KEYS = {
    "ffn_hidden_size": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "dropout": "attention_dropout",
    "num_experts": "num_local_experts",
    "moe_top_k": "num_experts_per_tok",
    "moe_ffn_hidden_size": "moe_intermediate_size",
    "moe_layer_freq": "decoder_sparse_step",
    "moe_first_dense_layers": "first_k_dense_replace",
    "moe_shared_ffn_hidden_size": "shared_expert_intermediate_size",
}


def load_model_file(path: Path) -> ModelSpec:
    path = Path(path)
    data = read_mapping(path, "model file")
    name = (path.absolute().parent.name or path.stem) if path.stem == "config" else path.stem
    return model_from_hf_config(data, name=name, where=str(path))


def _shown(value: Any) -> str:
    """A config value as the file spells it: null, true, a short repr."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 1000 else "a 300+ digit number"
    return text if len(text) <= 40 else text[:37] + "..."


def _whole(value: Any, key: str, where: str) -> int:
    """``value`` as an int if it is a whole number (4096, 4096.0, "4096"), else InputError."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 100:
        return int(value)
    raise InputError(f"{where}: {key} is {_shown(value)}; it must be a whole number, e.g. 32.")


def _number(value: Any, key: str, where: str) -> float:
    """``value`` as a finite float, else InputError."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(f"{where}: {key} is {_shown(value)}; it must be a finite number, e.g. 0.1.")
        return float(value)
    raise InputError(f"{where}: {key} is {_shown(value)}; it must be a number, e.g. 0.1.")


def _first(cfg: dict[str, Any], keys: tuple[str, ...], where: str, default: int = 0) -> tuple[int, str]:
    """The first of ``keys`` set to a non-empty value, as a whole number, and the key it came from."""
    for key in keys:
        if cfg.get(key):
            return _whole(cfg[key], key, where), key
    return default, keys[0]


def model_from_hf_config(cfg: dict[str, Any], name: str, where: str = "config") -> ModelSpec:
    """Translate HuggingFace config keys into a ModelSpec; any bad key ends in one sentence."""
    text = cfg.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise InputError(f"{where}: text_config is {_shown(text)}; it must be a mapping of the text model's keys.")
    cfg = {**cfg, **(text or {})}
    missing = [k for k in REQUIRED if k not in cfg]
    if "intermediate_size" not in cfg and "moe_intermediate_size" not in cfg:
        missing.append("intermediate_size")
    if missing:
        raise InputError(f"{where} lacks required key(s) {', '.join(missing)}; add them (see HuggingFace config.json).")
    keys = dict(_KEYS)
    heads = _whole(cfg["num_attention_heads"], "num_attention_heads", where)
    hidden = _whole(cfg["hidden_size"], "hidden_size", where)
    head_dim, _ = _first(cfg, ("head_dim",), where)
    if not head_dim:
        head_dim = hidden // heads if heads > 0 else 0
        keys["head_dim"] = "head_dim (hidden_size // num_attention_heads)"
    act = str(cfg.get("hidden_act", cfg.get("activation_function", "silu"))).lower()
    gated = act in _GATED_ACTS
    rms = "rms_norm_eps" in cfg or "layer_norm_eps" not in cfg and "layer_norm_epsilon" not in cfg
    experts, keys["num_experts"] = _first(cfg, ("num_local_experts", "num_experts", "n_routed_experts"), where)
    ffn, keys["ffn_hidden_size"] = _first(cfg, ("intermediate_size", "moe_intermediate_size"), where)
    moe: dict[str, Any] = {}
    if experts:
        moe_ffn, keys["moe_ffn_hidden_size"] = _first(cfg, ("moe_intermediate_size", "intermediate_size"), where)
        freq_key = "decoder_sparse_step" if "decoder_sparse_step" in cfg else "moe_layer_freq"
        freq, keys["moe_layer_freq"] = _whole(cfg.get(freq_key) or 1, freq_key, where), freq_key
        shared, _ = _first(cfg, ("shared_expert_intermediate_size",), where)
        if not shared:  # DeepSeek: n_shared_experts experts of moe_intermediate_size each
            shared = _first(cfg, ("n_shared_experts",), where)[0] * _first(cfg, ("moe_intermediate_size",), where)[0]
            keys["moe_shared_ffn_hidden_size"] = "n_shared_experts * moe_intermediate_size"
        moe = dict(
            num_experts=experts,
            moe_top_k=_whole(cfg.get("num_experts_per_tok", 2), "num_experts_per_tok", where),
            moe_ffn_hidden_size=moe_ffn,
            moe_layer_freq=freq,
            moe_first_dense_layers=_whole(cfg.get("first_k_dense_replace", 0), "first_k_dense_replace", where),
            moe_shared_ffn_hidden_size=shared,
        )
    try:
        return ModelSpec(
            name=name,
            family="llama" if gated else "gpt",
            hidden_size=hidden,
            ffn_hidden_size=ffn,
            num_layers=_whole(cfg["num_hidden_layers"], "num_hidden_layers", where),
            num_heads=heads,
            num_kv_heads=_first(cfg, ("num_key_value_heads",), where, default=heads)[0],
            head_dim=head_dim,
            vocab_size=_whole(cfg["vocab_size"], "vocab_size", where),
            max_position_embeddings=_whole(cfg.get("max_position_embeddings", 4096), "max_position_embeddings", where),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", not gated)),
            gated_mlp=gated,
            norm="rmsnorm" if rms else "layernorm",
            position="rope" if "rope_theta" in cfg or gated else "learned",
            bias=bool(cfg.get("attention_bias", cfg.get("bias", not gated))),
            dropout=_number(cfg.get("attention_dropout") or 0.0, "attention_dropout", where),
            **moe,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        msg = err["msg"].removeprefix("Value error, ").splitlines()[0]
        raise InputError(f"{where}: {keys.get(field, field)}: {msg}" if field else f"{where}: {msg}") from None
