"""Read a model from a HuggingFace-style ``config.json`` (or a YAML file with the same keys).

Key meanings follow HuggingFace transformers: ``hidden_act`` "silu"/"swiglu" means a gated
3-matrix MLP, any other activation transformers has (gelu, gelu_new, relu; relu2 is Nemotron's
squared ReLU) a plain 2-matrix MLP, a name it lacks is refused; GPT-OSS always gates, with a
clamped, offset quick GELU (swiglu_limit); Qwen3 and Gemma 3 normalise queries and keys per head
(no key says so); ``head_dim`` wins over hidden/heads when present; multimodal files nest the text
model under ``text_config``. MoE keys: Mixtral (num_local_experts, num_experts_per_tok), Qwen-MoE
(num_experts, moe_intermediate_size, decoder_sparse_step, mlp_only_layers, shared_expert_intermediate_size), DeepSeek
(n_routed_experts, first_k_dense_replace, n_shared_experts, moe_layer_freq), GPT-OSS
(num_local_experts, experts_per_token), Llama 4 (text_config: num_local_experts,
interleave_moe_layer_step, a shared expert of intermediate_size beside routed experts of
intermediate_size, dense layers of intermediate_size_mlp).

Which layers are MoE, as each family's modelling code decides it: Qwen layer i when (i + 1) %
decoder_sparse_step == 0 and i is not in mlp_only_layers; DeepSeek when i >= first_k_dense_replace
and i % moe_layer_freq == 0; Llama 4 layers interleave_moe_layer_step - 1, 2 step - 1, ... (or
its moe_layers list). A pattern ModelSpec cannot write (a dense prefix, then every k-th layer)
is refused.

Attention: DeepSeek's MLA keys (q_lora_rank, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim,
v_head_dim; query/key heads are qk_nope + qk_rope wide, whatever head_dim says) and
num_nextn_predict_layers (MTP modules); sliding windows from sliding_window and layer_types
("sliding_attention" / "full_attention", GPT-OSS), or on every layer when layer_types is absent
(Mistral) unless use_sliding_window is false (Qwen); GPT-OSS's attention sinks (model_type
gpt_oss: every GPT-OSS model has them, no key says so).
Rotary scaling: Llama 3.1's rope_scaling (rope_type "llama3": its factor) and YaRN's (rope_type or
type "yarn": GPT-OSS, DeepSeek-V3, Qwen3 past 32K: factor, original_max_position_embeddings, beta_fast,
beta_slow, DeepSeek's mscale and mscale_all_dim, GPT-OSS's truncate false).

Every value is read strictly: a whole number for a count, a finite one for a probability, true
or false for a flag; a string ("4096", "false") or a boolean where a number belongs is refused,
not converted. A key written as 0 or false is read as written, never taken for absent (only an
absent key, or null, gets the HuggingFace default), and ``ModelSpec`` checks the bounds. MoE
settings that contradict each other (two expert counts, experts of width 0, a dense prefix that
covers every layer) are refused. A refusal names the config key, not the ModelSpec field.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cost_models.model import MAX_LAYERS, ModelSpec, YarnScaling
from topologies.errors import InputError
from topologies.files import read_mapping

REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# GPT-2's own key names (transformers' GPT2Config.attribute_map, and n_inner for the MLP width)
_ALIASES = {
    "n_embd": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_positions": "max_position_embeddings",
    "n_inner": "intermediate_size",
    "n_ctx": "max_position_embeddings",
}
# model_type -> what its modelling code does that no key says: a gated MLP whatever the activation
# (Gemma's GeGLU), rotary positions, the share of each head they turn when the file does not say
# (partial_rotary_factor / rotary_pct defaults: GPT-NeoX 0.25, Phi 0.5, Nemotron 0.5), QKV biases only
# (Qwen2), biases on every linear layer, tied embeddings by default, queries and keys normalised per
# head (the q_norm / k_norm of head_dim in Qwen3's and Gemma 3's attention) or over the whole projections
# (OLMo 2's q_norm of num_heads x head_dim, k_norm of num_kv_heads x head_dim), norms after attention and
# after the MLP as well as before (Gemma 2 / 3), norms scaling by (1 + w) (Gemma's RMSNorm, Nemotron's
# LayerNorm1P), Gemma 2's logit soft-capping when its keys are absent (Gemma2Config: attention 50, final
# 30). Llama 4's weightless L2 query/key norm is its use_qk_norm key (default true, Llama4TextConfig).
KNOWN_TYPES = {
    "llama": {}, "mistral": {}, "mixtral": {}, "qwen2": {"qkv_bias": True}, "qwen2_moe": {"qkv_bias": True},
    "qwen3": {"qk_norm": True}, "qwen3_moe": {"qk_norm": True}, "deepseek_v2": {}, "deepseek_v3": {},
    "gpt_oss": {"gated": True}, "llama4": {}, "llama4_text": {},
    "gemma": {"gated": True, "tie": True, "plus_one": True},
    "gemma2": {"gated": True, "tie": True, "post_norms": True, "softcap": (50.0, 30.0), "plus_one": True},
    "gemma3": {"gated": True, "tie": True, "qk_norm": True, "post_norms": True, "plus_one": True},
    "gemma3_text": {"gated": True, "tie": True, "qk_norm": True, "post_norms": True, "plus_one": True},
    "gpt2": {"bias": True, "tie": True, "position": "learned", "gated": False, "norm": "layernorm"},
    "gpt_neox": {"bias": True, "position": "rope", "gated": False, "norm": "layernorm", "rotary": 0.25},
    "phi": {"bias": True, "position": "rope", "gated": False, "norm": "layernorm", "rotary": 0.5},
    "phi3": {"position": "rope"},
    "starcoder2": {"bias": True, "tie": True, "position": "rope", "gated": False, "norm": "layernorm"},
    "nemotron": {"position": "rope", "gated": False, "norm": "layernorm", "act": "relu2", "rotary": 0.5,
                 "plus_one": True},
    "olmo2": {"qk_norm": True, "qk_span": "projection"}, "granite": {},
}  # fmt: skip
_ROTARY_KEYS = ("partial_rotary_factor", "rotary_pct")  # GPT-NeoX: rotary_pct; transformers 5: in rope_parameters too
# Gemma 2 / 3 window every layer but each k-th when the file has no layer_types (their configs' rule)
_WINDOW_EVERY = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6}
_GATED_ACTS = {"silu", "swiglu", "swish"}
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")  # Mixtral, Qwen-MoE, DeepSeek
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
    "mtp_layers": "num_nextn_predict_layers",
    "full_attention_every": "layer_types",
    "activation_clamp": "swiglu_limit",
    "attention_softcap": "attn_logit_softcapping",
    "final_softcap": "final_logit_softcapping",
}
_MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


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
    """``value`` as an int if it is a whole number (4096 or 4096.0), else InputError: a string
    ("4096") or a boolean is refused, not converted, so a typo or a quoted number is caught."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    kind = " (a string)" if isinstance(value, str) else " (a boolean)" if isinstance(value, bool) else ""
    raise InputError(f"{where}: {key} is {_shown(value)}{kind}; it must be a whole number, e.g. 32.")


def _number(value: Any, key: str, where: str) -> float:
    """``value`` as a finite float, else InputError."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        too_big = isinstance(value, int) and abs(value) > sys.float_info.max  # 309+ digits: float() overflows
        if too_big or not math.isfinite(value):
            raise InputError(f"{where}: {key} is {_shown(value)}; it must be a finite number, e.g. 0.1.")
        return float(value)
    raise InputError(f"{where}: {key} is {_shown(value)}; it must be a number, e.g. 0.1.")


def _flag(cfg: dict[str, Any], key: str, where: str, default: bool) -> bool:
    """A boolean key: ``default`` when absent, else exactly true or false ("false" is refused:
    Python reads any non-empty string as true)."""
    if key not in cfg:
        return default
    value = cfg[key]
    if not isinstance(value, bool):
        raise InputError(f"{where}: {key} is {_shown(value)}; it must be true or false (unquoted).")
    return value


def _first(cfg: dict[str, Any], keys: tuple[str, ...], where: str, default: int = 0) -> tuple[int, str]:
    """The first of ``keys`` present in the file (null counts as absent, as in HuggingFace), as a
    whole number, and the key it came from; ``default`` and the first key when none is. A 0 or
    false that is written is read, never taken for absent."""
    for key in keys:
        if cfg.get(key) is not None:
            return _whole(cfg[key], key, where), key
    return default, keys[0]


def _experts(cfg: dict[str, Any], where: str) -> tuple[int, str]:
    """The routed experts and the key naming them; the keys of two families that disagree are
    refused (a file with num_local_experts 8 and n_routed_experts 64 is not one model)."""
    given = [(k, _whole(cfg[k], k, where)) for k in _EXPERT_KEYS if cfg.get(k) is not None]
    if len({n for _, n in given}) > 1:
        said = " and ".join(f"{k} {n}" for k, n in given)
        raise InputError(f"{where}: {said} disagree; keep the one key your model family uses.")
    return (given[0][1], given[0][0]) if given else (0, _EXPERT_KEYS[0])


def _moe_fields(cfg: dict[str, Any], experts: int, layers: int, where: str, keys: dict[str, str]) -> dict:
    """The MoE fields of an MoE config, refusing a setting that leaves it without MoE layers or
    its experts without a width."""
    moe_ffn, keys["moe_ffn_hidden_size"] = _first(cfg, ("moe_intermediate_size", "intermediate_size"), where)
    if moe_ffn == 0:
        k = keys["moe_ffn_hidden_size"]
        raise InputError(
            f"{where}: {k} is 0 but the model has {experts} experts; an expert needs a width of 1 or more."
        )
    first_dense, freq = _moe_layers(cfg, layers, where, keys)
    if layers > 0 and first_dense >= layers:
        raise InputError(
            f"{where}: first_k_dense_replace {first_dense} >= num_hidden_layers {layers} leaves no MoE layer, but "
            f"the model has {experts} experts; lower first_k_dense_replace or drop the expert keys."
        )
    if "shared_expert_intermediate_size" in cfg and cfg["shared_expert_intermediate_size"] is not None:
        shared = _whole(cfg["shared_expert_intermediate_size"], "shared_expert_intermediate_size", where)
    elif _is_llama4(cfg):  # Llama4TextMoe: one shared expert as wide as the routed ones
        shared = moe_ffn
        keys["moe_shared_ffn_hidden_size"] = "intermediate_size (Llama 4's shared expert)"
    else:  # DeepSeek: n_shared_experts experts of moe_intermediate_size each
        shared = _first(cfg, ("n_shared_experts",), where)[0] * moe_ffn
        keys["moe_shared_ffn_hidden_size"] = "n_shared_experts * moe_intermediate_size"
    return dict(
        num_experts=experts,
        moe_top_k=_first(cfg, ("num_experts_per_tok", "experts_per_token"), where, default=2)[0],
        moe_ffn_hidden_size=moe_ffn,
        moe_layer_freq=freq,
        moe_first_dense_layers=first_dense,
        moe_shared_ffn_hidden_size=shared,
    )


def _is_llama4(cfg: dict[str, Any]) -> bool:
    return str(cfg.get("model_type", "")).startswith("llama4") or "intermediate_size_mlp" in cfg


def _moe_layers(cfg: dict[str, Any], layers: int, where: str, keys: dict[str, str]) -> tuple[int, int]:
    """(dense prefix, every k-th layer after it) of the MoE layers, from whichever family's keys
    the file has, refusing a pattern of MoE layers that is not a prefix-then-every-k-th one."""
    if not 0 < layers <= MAX_LAYERS:  # ModelSpec refuses the count, naming num_hidden_layers; the
        return 0, 1  # patterns below list every layer, which would not end for 10**30 of them
    if cfg.get("moe_layers") is not None or cfg.get("interleave_moe_layer_step") is not None:  # Llama 4
        step, keys["moe_layer_freq"] = _first(cfg, ("interleave_moe_layer_step",), where, default=1)
        moe = cfg.get("moe_layers")
        listed = [_whole(i, "moe_layers", where) for i in moe] if isinstance(moe, list) else None
        first, freq, key = max(step, 1) - 1, max(step, 1), "moe_layers"
        if step < 1:
            return 0, step  # ModelSpec refuses it, naming interleave_moe_layer_step
    elif cfg.get("decoder_sparse_step") is not None or cfg.get("mlp_only_layers"):  # Qwen-MoE
        step, keys["moe_layer_freq"] = _first(cfg, ("decoder_sparse_step",), where, default=1)
        only = cfg.get("mlp_only_layers") or []
        if not isinstance(only, list):
            raise InputError(
                f"{where}: mlp_only_layers is {_shown(only)}; it must be a list of layer indices, e.g. [0, 1]."
            )
        dense = {_whole(i, "mlp_only_layers", where) for i in only}
        if any(not 0 <= i < layers for i in dense):
            raise InputError(
                f"{where}: mlp_only_layers {sorted(dense)[:8]} names layers outside 0..{layers - 1} "
                f"(num_hidden_layers {layers}); list only the model's layers."
            )
        listed = [i for i in range(layers) if (i + 1) % max(step, 1) == 0 and i not in dense]
        first, freq, key = max(step, 1) - 1, max(step, 1), "mlp_only_layers"
        if step < 1:
            return 0, step  # ModelSpec refuses it, naming decoder_sparse_step
    else:  # DeepSeek: i >= first_k_dense_replace and i % moe_layer_freq == 0
        prefix = _first(cfg, ("first_k_dense_replace",), where)[0]
        freq, keys["moe_layer_freq"] = _first(cfg, ("moe_layer_freq",), where, default=1)
        if freq < 1:
            return prefix, freq  # ModelSpec refuses it, naming moe_layer_freq
        return -(-prefix // freq) * freq, freq
    if listed is None:
        return first, freq
    if listed and (len(listed) == 1 or len({b - a for a, b in zip(listed, listed[1:], strict=False)}) == 1):
        first, freq = listed[0], (listed[1] - listed[0] if len(listed) > 1 else max(freq, layers))
    if listed != list(range(first, layers, freq)):
        raise InputError(
            f"{where}: {key} makes layers {listed[:8]} MoE; ntp writes MoE layers as a dense prefix then every "
            "k-th layer, which this is not."
        )
    return first, freq


def _window_fields(cfg: dict[str, Any], layers: int, where: str) -> dict:
    """sliding_window and full_attention_every from sliding_window and layer_types."""
    window = cfg.get("sliding_window")
    if window is None or cfg.get("use_sliding_window") is False:
        return {}
    window = _whole(window, "sliding_window", where)
    types = cfg.get("layer_types")
    every = cfg.get("sliding_window_pattern", _WINDOW_EVERY.get(cfg.get("model_type")))
    if types is None and every is not None:  # Gemma 2 / 3: full attention on each k-th layer
        k = _whole(every, "sliding_window_pattern", where)
        if k < 1:
            raise InputError(f"{where}: sliding_window_pattern is {k}; it must be 1 or more (each k-th layer full).")
        return dict(sliding_window=window, full_attention_every=k)
    if types is None:  # Mistral: every layer windowed
        return dict(sliding_window=window, full_attention_every=0)
    if not isinstance(types, list) or len(types) != layers:
        raise InputError(f"{where}: layer_types must list one attention type per layer ({layers}).")
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    if not full:
        return dict(sliding_window=window, full_attention_every=0)
    if len(full) == layers:
        return {}
    k = full[0] + 1
    if full != list(range(k - 1, layers, k)):
        raise InputError(
            f"{where}: layer_types puts full attention on layers {full[:8]}; ntp writes them as every k-th layer "
            "(layer i full when (i + 1) % k == 0), which this is not."
        )
    return dict(sliding_window=window, full_attention_every=k)


def _attention_fields(cfg: dict[str, Any], layers: int, where: str) -> dict:
    """MLA, MTP, sliding-window and sink fields; MLA's query/key head width is qk_nope + qk_rope."""
    fields = {k: _first(cfg, (k,), where)[0] for k in _MLA_KEYS if cfg.get(k) is not None}
    if fields.get("kv_lora_rank"):
        fields["head_dim"] = fields.get("qk_nope_head_dim", 0) + fields.get("qk_rope_head_dim", 0)
    mtp = _first(cfg, ("num_nextn_predict_layers",), where)[0]
    fields |= dict(mtp_layers=mtp) if mtp else {}
    fields |= _window_fields(cfg, layers, where)
    return fields | (dict(attention_sinks=True) if cfg.get("model_type") == "gpt_oss" else {})


_YARN_NUMBERS = ("factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")


def _rope_block(cfg: dict[str, Any]) -> tuple[str, dict]:
    """The rotary settings' block and its name: ``rope_scaling``, or transformers 5's
    ``rope_parameters``, which also holds rope_theta (("", {}) when neither is a mapping)."""
    return next(((k, cfg[k]) for k in ("rope_scaling", "rope_parameters") if isinstance(cfg.get(k), dict)), ("", {}))


def _yarn(cfg: dict[str, Any], where: str) -> YarnScaling | None:
    """YaRN's settings from ``rope_scaling`` (or transformers 5's ``rope_parameters``) when its
    rope_type (or type, DeepSeek-V3's spelling) is "yarn"; original_max_position_embeddings
    defaults to max_position_embeddings, as transformers' _compute_yarn_parameters reads it. A key of another scaling
    (attention_factor, which overrides the mscale rule) is refused, not ignored."""
    block, scaling = _rope_block(cfg)
    if (scaling.get("rope_type") or scaling.get("type")) != "yarn":
        return None
    if scaling.get("attention_factor") is not None:
        raise InputError(
            f"{where}: {block}.attention_factor is not read by ntp; leave it out to scale as YaRN's rule does."
        )
    given = {k: _number(scaling[k], f"{block}.{k}", where) for k in _YARN_NUMBERS if scaling.get(k) is not None}
    key = "original_max_position_embeddings"
    if scaling.get(key) is not None:
        original = _whole(scaling[key], f"{block}.{key}", where)
    else:
        original = _whole(cfg.get("max_position_embeddings", 4096), "max_position_embeddings", where)
    truncate = _flag(scaling, "truncate", where, True)
    try:
        return YarnScaling(**given, original_max_position_embeddings=original, truncate=truncate)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = f"{block}.{err['loc'][0]}" if err["loc"] else block
        msg = err["msg"].removeprefix("Value error, ").splitlines()[0]
        raise InputError(f"{where}: {key}: {msg}") from None


_EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", "norm_eps")  # Nemotron: norm_eps
_QKV_BIAS_TYPES = {"qwen2", "qwen2_moe", "qwen2_vl"}  # Qwen2's attention: q, k, v with bias, o without


def _exported_fields(cfg: dict[str, Any], where: str, keys: dict[str, str]) -> dict:
    """What the exports carry so the framework builds this model: rotary base and Llama 3.1
    scaling, norm epsilon, Qwen2's QKV bias, the router's aux-loss weight, score function and
    expert bias. Absent keys stay unset (the framework's default)."""
    out: dict[str, Any] = {}
    block, scaling = _rope_block(cfg)  # transformers 5 writes rope_theta and the scaling in rope_parameters
    if cfg.get("rope_theta") is not None:
        out["rope_theta"] = _number(cfg["rope_theta"], "rope_theta", where)
    elif scaling.get("rope_theta") is not None:
        key = keys["rope_theta"] = f"{block}.rope_theta"
        out["rope_theta"] = _number(scaling["rope_theta"], key, where)
    if (scaling.get("rope_type") or scaling.get("type")) == "llama3":
        out["rope_scaling_factor"] = _number(scaling.get("factor", 8.0), f"{block}.factor", where)
        keys["rope_scaling_factor"] = f"{block}.factor"
    yarn = _yarn(cfg, where)
    if yarn is not None:
        out["yarn"] = yarn
    for key in _EPS_KEYS:
        if cfg.get(key) is not None:
            out["norm_eps"], keys["norm_eps"] = _number(cfg[key], key, where), key
            break
    if cfg.get("model_type") in _QKV_BIAS_TYPES:
        out["qkv_bias"] = True
    for key in ("router_aux_loss_coef", "aux_loss_alpha"):
        if cfg.get(key) is not None:
            out["moe_aux_loss_coeff"], keys["moe_aux_loss_coeff"] = _number(cfg[key], key, where), key
            break
    score = cfg.get("scoring_func")
    if score is not None:
        out["moe_router_score_function"], keys["moe_router_score_function"] = score, "scoring_func"
    elif _is_llama4(cfg):  # Llama4TextMoe: sigmoid of the top-k router logits
        out["moe_router_score_function"] = "sigmoid"
    if cfg.get("topk_method") == "noaux_tc":  # DeepSeek-V3's aux-loss-free balancing bias
        out["moe_router_expert_bias"] = True
    return out


def _norm_and_rotary_fields(cfg: dict[str, Any], traits: dict, where: str, keys: dict[str, str]) -> dict:
    """What the exports carry of the norms and the rotation: norms scaling by (1 + w), the span of
    the query/key norms, Llama 4's weightless L2 query/key norm (use_qk_norm) and the share of each
    head rotated (partial_rotary_factor or rotary_pct, at the top or in rope_parameters; else the
    family's default)."""
    out: dict[str, Any] = {}
    if traits.get("plus_one"):
        out["norm_zero_centered"] = True
    if traits.get("qk_span"):
        out["qk_norm_span"] = traits["qk_span"]
    if _is_llama4(cfg):
        out["qk_l2_norm"] = _flag(cfg, "use_qk_norm", where, True) or None
        out["nope_every"] = _nope_every(cfg, where, keys) or None
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    given = [(k, cfg[k]) for k in _ROTARY_KEYS if cfg.get(k) is not None]
    given += [(f"rope_parameters.{k}", rope[k]) for k in _ROTARY_KEYS if rope.get(k) is not None]
    if given:
        keys["rotary_fraction"] = given[0][0]
        out["rotary_fraction"] = _number(given[0][1], given[0][0], where)
    elif "rotary" in traits:
        out["rotary_fraction"] = traits["rotary"]
    return {k: v for k, v in out.items() if v is not None}


def _nope_every(cfg: dict[str, Any], where: str, keys: dict[str, str]) -> int:
    """Llama 4's layers without rotary positions as every k-th one: its no_rope_layers list (1 =
    rotary, as Llama4TextConfig reads it; empty or absent: the interval's pattern), or layer i
    when (i + 1) % no_rope_layer_interval == 0 (default 4). A list of another pattern is refused."""
    layers = _whole(cfg["num_hidden_layers"], "num_hidden_layers", where)
    listed = cfg.get("no_rope_layers")
    if not listed:
        keys["nope_every"] = "no_rope_layer_interval"
        return _first(cfg, ("no_rope_layer_interval",), where, default=4)[0]
    if not isinstance(listed, list) or len(listed) != layers:
        raise InputError(f"{where}: no_rope_layers must list 1 (rotary) or 0 (none) for each of {layers} layers.")
    nope = [i for i, rotary in enumerate(listed) if not _whole(rotary, "no_rope_layers", where)]
    k = nope[0] + 1 if nope else 0
    if k and nope != list(range(k - 1, layers, k)):
        raise InputError(
            f"{where}: no_rope_layers leaves layers {nope[:8]} without rotary positions; ntp writes them as every "
            "k-th layer (layer i when (i + 1) % k == 0), which this is not."
        )
    keys["nope_every"] = "no_rope_layers"
    return k


def _softcap_fields(cfg: dict[str, Any], defaults: tuple, where: str) -> dict:
    """Gemma 2's attention and output logit soft-capping (null: none, as in transformers)."""
    out = {}
    for field, default in zip(("attention_softcap", "final_softcap"), defaults, strict=True):
        key = _KEYS[field]
        value = cfg.get(key, default)
        if value is not None:
            out[field] = _number(value, key, where)
    return out


QUICK_GELU_ALPHA = 1.702  # GPT-OSS's swiglu_alpha: gate * sigmoid(1.702 gate), Megatron's quick_gelu


def _activation_fields(cfg: dict[str, Any], act: str, gated: bool, where: str) -> dict:
    """The MLP's activation beyond gated or not: Gemma's GeGLU (gelu_pytorch_tanh gates with GELU),
    GPT-OSS's clamped, offset quick-GELU gate (GptOssExperts: (up + 1) * gate * sigmoid(alpha gate),
    gate clamped to <= swiglu_limit and up to +-swiglu_limit; alpha 1.702 and limit 7.0 unless the file
    says otherwise), Nemotron's squared ReLU (hidden_act relu2)."""
    if cfg.get("model_type") == "gpt_oss":
        alpha = _number(cfg.get("swiglu_alpha", QUICK_GELU_ALPHA), "swiglu_alpha", where)
        if alpha != QUICK_GELU_ALPHA:
            raise InputError(
                f"{where}: swiglu_alpha is {_shown(alpha)}; ntp and Megatron's quick GELU gate with sigmoid(1.702 x), "
                "so write 1.702 or leave the key out."
            )
        limit = _number(cfg.get("swiglu_limit", 7.0), "swiglu_limit", where)
        return dict(gate_activation="quick_gelu", gate_linear_offset=1.0, activation_clamp=limit)
    if gated and "gelu" in act.lower():
        return dict(gate_activation="gelu")
    if not gated and act.lower() == "relu2":
        return dict(mlp_activation="squared_relu")
    return {}


# transformers' activation names (ACT2CLS, transformers 5.x); "swiglu" is ntp's own spelling of a gated SiLU MLP
_KNOWN_ACTS = _GATED_ACTS | {
    "gelu", "gelu_10", "gelu_fast", "gelu_new", "gelu_python", "gelu_pytorch_tanh", "gelu_python_tanh",
    "gelu_accurate", "hardswish", "laplace", "leaky_relu", "linear", "mish", "quick_gelu", "relu", "relu2", "relu6",
    "sigmoid", "sqrtsoftplus", "tanh", "prelu", "xielu",
}  # fmt: skip


def _activation(cfg: dict[str, Any], traits: dict, where: str) -> str:
    """The MLP's activation name (hidden_activation, hidden_act or activation_function), one that
    transformers knows: another (a typo, "squared_relu") was read as a plain GELU MLP."""
    key = next((k for k in ("hidden_activation", "hidden_act", "activation_function") if cfg.get(k)), "hidden_act")
    act = cfg.get(key, traits.get("act", "silu"))  # NemotronConfig's hidden_act default: relu2
    if not isinstance(act, str):
        raise InputError(f'{where}: {key} is {_shown(act)}; it must be an activation name, e.g. "silu".')
    if act.lower() not in _KNOWN_ACTS:
        raise InputError(
            f'{where}: {key} is {_shown(act)}, not an activation transformers builds; write one such as "silu" '
            '(a gated MLP), "gelu", "gelu_pytorch_tanh" or "relu2" (squared ReLU).'
        )
    return act


def model_from_hf_config(cfg: dict[str, Any], name: str, where: str = "config") -> ModelSpec:
    """Translate HuggingFace config keys into a ModelSpec; any bad key ends in one sentence."""
    text = cfg.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise InputError(f"{where}: text_config is {_shown(text)}; it must be a mapping of the text model's keys.")
    cfg = {**cfg, **(text or {})}
    for alias, key in _ALIASES.items():  # GPT-2 spells the shapes its own way
        if cfg.get(alias) is not None and cfg.get(key) is None:
            cfg[key] = cfg[alias]
    kind = cfg.get("model_type")
    if kind is not None and not isinstance(kind, str):
        raise InputError(f'{where}: model_type is {_shown(kind)}; it must be the family\'s name, e.g. "llama".')
    if kind is not None and kind not in KNOWN_TYPES:
        known = ", ".join(sorted(KNOWN_TYPES))
        raise InputError(
            f"{where}: model_type {_shown(kind)} is not one ntp reads ({known}); its modelling code may build layers "
            "ntp would count wrong, so write the fields of cost_models.ModelSpec in a YAML file instead"
        )
    traits = KNOWN_TYPES.get(kind, {})
    if "intermediate_size" not in cfg and kind == "gpt2":  # GPT2MLP: n_inner or 4 x n_embd
        cfg["intermediate_size"] = 4 * _whole(cfg["hidden_size"], "n_embd", where)
    missing = [k for k in REQUIRED if k not in cfg]
    if "intermediate_size" not in cfg and "moe_intermediate_size" not in cfg:
        missing.append("intermediate_size")
    if missing:
        raise InputError(f"{where} lacks required key(s) {', '.join(missing)}; add them (see HuggingFace config.json).")
    keys = dict(_KEYS)
    heads = _whole(cfg["num_attention_heads"], "num_attention_heads", where)
    hidden = _whole(cfg["hidden_size"], "hidden_size", where)
    layers = _whole(cfg["num_hidden_layers"], "num_hidden_layers", where)
    if cfg.get("head_dim") is None:  # absent: hidden / heads, as HuggingFace
        head_dim = hidden // heads if heads > 0 else 0
        keys["head_dim"] = "head_dim (hidden_size // num_attention_heads)"
    else:  # written: read as written, 0 included (ModelSpec refuses it, naming head_dim)
        head_dim = _whole(cfg["head_dim"], "head_dim", where)
    act = _activation(cfg, traits, where)
    gated = traits.get("gated", act.lower() in _GATED_ACTS)
    rms = "rms_norm_eps" in cfg or "layer_norm_eps" not in cfg and "layer_norm_epsilon" not in cfg
    norm = traits.get("norm", "rmsnorm" if rms else "layernorm")
    experts, keys["num_experts"] = _experts(cfg, where)
    ffn, keys["ffn_hidden_size"] = _first(
        cfg, ("intermediate_size_mlp", "intermediate_size", "moe_intermediate_size"), where
    )
    moe = _moe_fields(cfg, experts, layers, where, keys) if experts else {}
    arch = _attention_fields(cfg, layers, where)
    head_dim = arch.pop("head_dim", head_dim)
    exported = _exported_fields(cfg, where, keys)
    exported |= _activation_fields(cfg, act, gated, where)
    exported |= {k: True for k in ("qk_norm", "post_norms") if traits.get(k)}
    exported |= _norm_and_rotary_fields(cfg, traits, where, keys)
    exported |= _softcap_fields(cfg, traits.get("softcap", (None, None)), where)
    default_bias = traits.get("bias", not gated if kind is None else False)  # a typeless file: as before
    bias = _flag(cfg, "attention_bias", where, _flag(cfg, "bias", where, default_bias))
    dropout = cfg.get("attention_dropout")
    try:
        return ModelSpec(
            name=name,
            family="llama" if gated else "gpt",
            hidden_size=hidden,
            ffn_hidden_size=ffn,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=_first(cfg, ("num_key_value_heads",), where, default=heads)[0],
            head_dim=head_dim,
            vocab_size=_whole(cfg["vocab_size"], "vocab_size", where),
            max_position_embeddings=_whole(cfg.get("max_position_embeddings", 4096), "max_position_embeddings", where),
            tie_embeddings=_flag(cfg, "tie_word_embeddings", where, traits.get("tie", not gated and kind is None)),
            gated_mlp=gated,
            norm=norm,
            position=traits.get("position", "rope" if "rope_theta" in cfg or gated or kind else "learned"),
            bias=bias,
            dropout=0.0 if dropout is None else _number(dropout, "attention_dropout", where),
            **moe,
            **arch,
            **exported,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        msg = err["msg"].removeprefix("Value error, ").splitlines()[0]
        if field:
            raise InputError(f"{where}: {keys.get(field, field)}: {msg}") from None
        raise InputError(f"{where}: {_in_config_spelling(msg, keys)}") from None


def _in_config_spelling(message: str, keys: dict[str, str]) -> str:
    """A ModelSpec message about several fields, with each field named by the config key it was
    read from: ``moe_top_k (9) must be in 1..num_experts (8)`` becomes ``num_experts_per_tok (9)
    must be in 1..num_local_experts (8)``.

    >>> _in_config_spelling("num_heads (31) must be a multiple of num_kv_heads (8)", dict(_KEYS))
    'num_attention_heads (31) must be a multiple of num_key_value_heads (8)'
    """
    names = sorted((f for f in keys if keys[f] != f), key=len, reverse=True)
    if not names:
        return message
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    return pattern.sub(lambda m: keys[m.group(1)], message)
