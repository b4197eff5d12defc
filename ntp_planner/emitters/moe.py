"""What every target says about experts and the newer attention variants, in megatron-core config
field names (``TransformerConfig`` / ``MLATransformerConfig``, megatron-core 0.16): the experts'
grid (``expert_model_parallel_size`` x ``expert_tensor_parallel_size``, Megatron's parallel
folding), the token dispatcher, the A2A overlap and its rules, multi-head latent attention,
multi-token prediction, sliding windows and attention sinks. Each target maps these names to its
own (``megatron.FLAGS``) or drops the ones it cannot run, with a note (``UNSUPPORTED``)."""

from __future__ import annotations

from cost_models import moe
from cost_models.layout import ParallelLayout
from cost_models.model import ModelSpec
from ntp_planner.plan import Plan

ROUTER_NOTE = (
    "the model states no load-balancing loss weight (router_aux_loss_coef in its config.json): megatron-core's "
    "default applies (moe_aux_loss_coeff 0, no balancing loss); set the model's own (Mixtral: 0.02)"
)

MLA_NOTE = (
    "{target}: multi-head latent attention is a config class of its own (megatron-core's MLATransformerConfig): "
    "apply these settings to {config}; on a GPT config the MLA fields build no MLA layers"
)


def flex_backend(plan: Plan) -> str:
    """The flex dispatcher's backend: the plan's (``TrainingSpec.moe_flex_backend``), else HybridEP
    where one NVLink domain spans several hosts (GB200 / GB300 NVL72, what it was written for: it
    dispatches over the multi-node NVLink) and DeepEP elsewhere (NVLink inside a host, RDMA across
    hosts, one copy of a token per host): the cost model's rule, ``cost_models.moe.flex_backend_of``."""
    spec = plan.cluster.spec
    return moe.flex_backend_of(plan.training.moe_flex_backend, spec.domain_size, spec.gpus_per_node)


def overlap_refusal(plan: Plan, layout: ParallelLayout) -> str | None:
    """Why megatron-core 0.16 refuses ``overlap_moe_expert_parallel_comm`` for this plan
    (TransformerConfig.__post_init__'s assertions), or None when it runs: EP > 1, the alltoall or
    flex dispatcher, virtual pipeline stages when pp > 1, no full recomputation, at most one MTP
    layer and, with one, pp > 1."""
    m = plan.model
    rules = [
        (layout.ep > 1, f"it needs expert parallelism (ep is {layout.ep})"),
        (layout.moe_dispatcher in ("alltoall", "flex"), f"the {layout.moe_dispatcher} dispatcher has no overlap"),
        (layout.pp == 1 or layout.vpp > 1, f"pp {layout.pp} > 1 needs virtual pipeline stages (vpp is 1)"),
        (layout.recompute != "full", "full recomputation is on"),
        (m.mtp_layers <= 1, f"{m.mtp_layers} MTP layers (it takes at most 1)"),
        (m.mtp_layers != 1 or layout.pp > 1, "one MTP layer needs pp > 1"),
    ]
    broken = [why for ok, why in rules if not ok]
    return "; ".join(broken) or None


def moe_fields(plan: Plan, layout: ParallelLayout) -> dict:
    """The experts, their grid and their dispatch, as megatron-core config fields (None: unset).
    ``moe_layer_freq`` is an int when every layer is MoE, else megatron's per-layer 0/1 list (it
    covers first-k dense layers and interleaving alike)."""
    m = plan.model
    if not m.is_moe:
        return {}
    pattern = [int(m.is_moe_layer(i)) for i in range(m.num_layers)]
    overlap = layout.moe_overlap != "none" and overlap_refusal(plan, layout) is None
    return {
        "num_moe_experts": m.num_experts,
        "moe_router_topk": m.moe_top_k,
        # megatron-core refuses top-1 after the softmax (every weight would be 1: no gradient)
        "moe_router_pre_softmax": True if m.moe_top_k == 1 else None,
        "moe_ffn_hidden_size": m.moe_ffn_hidden_size,
        "moe_grouped_gemm": True,
        "moe_token_dispatcher_type": layout.moe_dispatcher,
        "moe_flex_dispatcher_backend": flex_backend(plan) if layout.moe_dispatcher == "flex" else None,
        "expert_model_parallel_size": layout.ep,
        "expert_tensor_parallel_size": layout.expert_tp,
        "overlap_moe_expert_parallel_comm": overlap or None,
        "moe_layer_freq": 1 if all(pattern) else pattern,
        "moe_shared_expert_intermediate_size": m.moe_shared_ffn_hidden_size or None,
    }


def attention_fields(m: ModelSpec) -> dict:
    """MLA, MTP, sliding-window and sink fields (None: unset). MLA's query/key head is
    ``qk_head_dim`` (no-rope part) + ``qk_pos_emb_head_dim`` (rope part); its RMSNorms of the
    query and KV latents (DeepSeek-V3's ``q_a_layernorm``, ``kv_a_layernorm``) are megatron-core's
    ``qk_layernorm`` (without it, Megatron's local layers build MLA without them), as are Qwen3's and
    Gemma 3's per-head query and key norms (``ModelSpec.qk_norm``); Llama 4's weightless L2 norm of
    each query and key head is ``qk_l2_norm``, its layers without rotary positions ``no_rope_freq``
    (an int k: layer i from 1 skips rotary when i % k == 0). The window: the model
    holds Hugging Face's ``sliding_window`` (tokens seen, the current one included), megatron-core
    takes ``window_size = (left, right)`` tokens beside the current one, so (w - 1, 0) as
    Megatron-Bridge's GPT-OSS bridge converts it; ``window_attn_skip_freq`` k makes layer i (from 1)
    full when i % k == 0, the ModelSpec's ``full_attention_every`` rule (0 = every layer windowed:
    unset). Sinks: megatron's ``softmax_type = 'learnable'`` (a learned offset per head)."""
    windowed = m.sliding_window > 0 and m.full_attention_every != 1
    fields = {
        "multi_latent_attention": m.is_mla or None,
        "q_lora_rank": (m.q_lora_rank or None) if m.is_mla else None,
        "kv_lora_rank": m.kv_lora_rank if m.is_mla else None,
        "qk_head_dim": m.qk_nope_head_dim if m.is_mla else None,
        "qk_pos_emb_head_dim": m.qk_rope_head_dim if m.is_mla else None,
        "v_head_dim": m.v_head_dim if m.is_mla else None,
        # MLA's latent norms (megatron-core builds them only with it), or the per-head query/key norms
        # (megatron-core has none over the whole projections, OLMo 2's: megatron.missing_model_notes)
        "qk_layernorm": (m.is_mla or (m.qk_norm and m.qk_norm_span == "head")) or None,
        "qk_l2_norm": m.qk_l2_norm or None,
        "no_rope_freq": m.nope_every or None,  # megatron-core skips rotary on layer i when (i + 1) % k == 0
        "mtp_num_layers": m.mtp_layers or None,
        "window_size": (m.sliding_window - 1, 0) if windowed else None,
        "window_attn_skip_freq": (m.full_attention_every or None) if windowed else None,
        "softmax_type": "learnable" if m.attention_sinks else None,
    }
    return {k: v for k, v in fields.items() if v is not None}


def model_fields(m: ModelSpec) -> dict:
    """What makes the framework build the model its authors wrote, beyond the shapes (None:
    unset, the framework's default): the rotary base and Llama 3.1 scaling (GPT model arguments
    in Megatron: ``rotary_base``, ``rope_scaling``, ``rope_scaling_factor``), the norm epsilon,
    Qwen2's QKV-only bias, GPT-OSS's gate offset and clamp, norms scaling by (1 + w)
    (``layernorm_zero_centered_gamma``), partial rotary (``rotary_percent``, a GPT model argument
    like the rotary base), and the router's aux-loss weight, score
    function and expert bias (TransformerConfig fields). The activation function itself is a
    callable: each target says it its own way (Megatron-LM's switches, Bridge's recipe)."""
    fields = {
        "rotary_base": _number(m.rope_theta) if m.position == "rope" else None,
        "rope_scaling": True if m.rope_scaling_factor else None,
        "rope_scaling_factor": _number(m.rope_scaling_factor),
        "layernorm_epsilon": m.norm_eps,
        "add_qkv_bias": True if m.qkv_bias and not m.bias else None,
        # GPT-OSS's gate: (up + offset) * act(gate), clamped (megatron-core's glu_linear_offset and
        # activation_func_clamp_value, which its quick_gelu path and Bridge's GPT-OSS provider use)
        "glu_linear_offset": _number(m.gate_linear_offset) if m.gated_mlp and m.gate_linear_offset else None,
        "activation_func_clamp_value": _number(m.activation_clamp) if m.gated_mlp else None,
        # Nemotron's LayerNorm1P, Gemma's (1 + w) RMSNorm; the share of each head rotary positions turn
        "layernorm_zero_centered_gamma": m.norm_zero_centered or None,
        "rotary_percent": _number(m.rotary_fraction) if m.position == "rope" and m.rotary_fraction != 1 else None,
    }
    fields |= yarn_fields(m)
    if m.is_moe:
        fields |= {
            "moe_aux_loss_coeff": m.moe_aux_loss_coeff,
            "moe_router_score_function": m.moe_router_score_function
            if m.moe_router_score_function != "softmax"
            else None,
            "moe_router_enable_expert_bias": m.moe_router_expert_bias or None,
        }
    return {k: v for k, v in fields.items() if v is not None}


def position_type(m: ModelSpec) -> str:
    """megatron-core's position_embedding_type: YaRN on a GPT model is a type of its own ('yarn');
    MLA takes its rotary kind as rope_type (``yarn_fields``), beside plain 'rope'."""
    if m.position != "rope":
        return "learned_absolute"
    return "yarn" if m.yarn is not None and not m.is_mla else "rope"


# MLATransformerConfig's YaRN fields with no Megatron-LM flag (its --yarn-* arguments set the GPT model's
# yarn_* attributes only), at megatron-core 0.19.2's defaults
MLA_YARN_DEFAULTS = {"original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}


def yarn_fields(m: ModelSpec) -> dict:
    """YaRN as megatron-core reads it (empty without it). A GPT model takes ``position_embedding_type
    'yarn'`` and the ``yarn_*`` attributes GPTModel reads (Megatron-Bridge's and NeMo 2's GPT-OSS
    configs declare them); MLA takes MLATransformerConfig's ``rope_type 'yarn'`` and its unprefixed
    fields, and always rounds the ramp's ends (no truncate field). The attention scale: HF scales by
    (0.1 m ln s + 1) / (0.1 m_all ln s + 1) when mscale and mscale_all_dim are given, else by
    0.1 ln s + 1, which megatron-core computes from mscale 1, mscale_all_dim 0 (1 / 1 = its ratio)."""
    y = m.yarn
    if y is None:
        return {}
    mscale = (y.mscale, y.mscale_all_dim) if y.mscale is not None else (1.0, 0.0)
    if m.is_mla:
        return {
            "rope_type": "yarn",
            "rotary_scaling_factor": _number(y.factor),
            "original_max_position_embeddings": y.original_max_position_embeddings,
            "beta_fast": _number(y.beta_fast),
            "beta_slow": _number(y.beta_slow),
            "mscale": _number(mscale[0]),
            "mscale_all_dim": _number(mscale[1]),
        }
    return {
        "position_embedding_type": "yarn",
        "yarn_rotary_scaling_factor": _number(y.factor),
        "yarn_original_max_position_embeddings": y.original_max_position_embeddings,
        "yarn_beta_fast": _number(y.beta_fast),
        "yarn_beta_slow": _number(y.beta_slow),
        "yarn_correction_range_round_to_int": y.truncate,
        "yarn_mscale": _number(mscale[0]),
        "yarn_mscale_all_dim": _number(mscale[1]),
    }


def yarn_notes(m: ModelSpec, target: str) -> list[str]:
    """What megatron-core's MLA cannot build of the model's YaRN: unrounded ramp ends."""
    if m.yarn is None or not m.is_mla or m.yarn.truncate:
        return []
    return [
        f"{target}: megatron-core's MLA rounds YaRN's ramp ends to whole dimensions; {m.name}'s rope_scaling has "
        "truncate false: its rotary frequencies differ slightly from the model's"
    ]


FP8_ATTENTION_NOTE = (
    "{target}: the plan runs fp8 attention (fp8_attention) but {why}: attention runs in bf16, slower than "
    "predicted, unless you set megatron-core's fp8_dot_product_attention {how}"
)


def _number(x: float | None) -> int | float | None:
    """A float that is whole as an int (500000, not 500000.0): the flags read as written."""
    return int(x) if x is not None and float(x).is_integer() else x


# target -> megatron-core fields it cannot run, and why (the field is dropped, the reason printed)
_NEMO1 = "NeMo 1.x builds its GPT from megatron-core releases before {what}"
UNSUPPORTED: dict[str, dict[str, str]] = {
    "NeMo": {
        "expert_tensor_parallel_size": _NEMO1.format(
            what="expert tensor parallelism (parallel folding): its experts "
            "split over the attention's TP ranks, so export with --format nemo2, bridge or megatron"
        ),
        "moe_flex_dispatcher_backend": _NEMO1.format(what="the flex (DeepEP / HybridEP) dispatcher"),
        "overlap_moe_expert_parallel_comm": _NEMO1.format(what="the EP all-to-all overlap"),
        "multi_latent_attention": _NEMO1.format(what="multi-head latent attention"),
        "mtp_num_layers": _NEMO1.format(what="multi-token prediction"),
        "window_size": _NEMO1.format(what="sliding-window attention in its GPT layers"),
        "softmax_type": _NEMO1.format(what="attention sinks (softmax_type)"),
        "rope_scaling": _NEMO1.format(what="Llama 3.1's rotary scaling (rope_scaling)"),
        "yarn_rotary_scaling_factor": _NEMO1.format(what="YaRN rotary scaling (position_embedding_type 'yarn')"),
        "moe_router_score_function": _NEMO1.format(what="sigmoid routing (moe_router_score_function)"),
        "moe_router_enable_expert_bias": _NEMO1.format(what="aux-loss-free expert bias"),
        "glu_linear_offset": _NEMO1.format(what="GPT-OSS's offset gate (glu_linear_offset)"),
        "activation_func_clamp_value": _NEMO1.format(what="GPT-OSS's clamped gate (activation_func_clamp_value)"),
        "qk_l2_norm": _NEMO1.format(what="Llama 4's L2 query/key norm (qk_l2_norm)"),
        "no_rope_freq": _NEMO1.format(what="layers without rotary positions (no_rope_freq, Llama 4's NoPE layers)"),
    },
}
_MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "qk_layernorm",
               "rope_type", "rotary_scaling_factor", *MLA_YARN_DEFAULTS, "mscale", "mscale_all_dim")  # fmt: skip
_YARN_REST = tuple(
    f"yarn_{k}" for k in (*MLA_YARN_DEFAULTS, "correction_range_round_to_int", "mscale", "mscale_all_dim")
)
# what goes with a dropped field: fields dropped with it, or set to what the target runs instead
_WITH: dict[str, dict] = {
    "moe_flex_dispatcher_backend": {"moe_token_dispatcher_type": "alltoall"},
    "multi_latent_attention": dict.fromkeys(_MLA_FIELDS),
    "window_size": {"window_attn_skip_freq": None},
    "rope_scaling": {"rope_scaling_factor": None},
    "yarn_rotary_scaling_factor": dict.fromkeys(("position_embedding_type", *_YARN_REST)),
}


def supported(fields: dict, target: str, folded: bool) -> tuple[dict, list[str]]:
    """``fields`` without those ``target`` cannot run, and a note for each dropped one. An
    unfolded grid (etp = tp) needs no expert-TP field: the target splits experts like attention."""
    out, notes = dict(fields), []
    if not folded and "expert_tensor_parallel_size" in UNSUPPORTED.get(target, {}):
        out.pop("expert_tensor_parallel_size", None)
    for key, why in UNSUPPORTED.get(target, {}).items():
        if out.get(key) is None:
            continue
        out.pop(key)
        for k, instead in _WITH.get(key, {}).items():
            out.pop(k, None)
            if instead is not None:
                out[k] = instead
        runs = "".join(f", {k} {v}" for k, v in _WITH.get(key, {}).items() if v is not None)
        notes.append(f"{target}: {key} dropped{runs}: {why}")
    return out, notes


def moe_warnings(plan: Plan, layout: ParallelLayout, target: str) -> list[str]:
    """What the export of experts cannot carry as planned: the router settings the plan lacks, and
    an A2A overlap the target runs differently (DualPipe) or refuses (dropped, with the rule)."""
    if not plan.model.is_moe:
        return []
    m = plan.model
    unstated = m.moe_aux_loss_coeff is None and not m.moe_router_expert_bias  # expert bias: balanced without one
    notes = [f"{target}: {ROUTER_NOTE}"] if unstated else []
    if plan.model.bias and layout.expert_tp != 1:
        notes.append(
            f"{target}: megatron-core runs experts with biases only at expert TP 1 ('Bias in Moe is only supported "
            f"when ETP==1'); this plan has etp {layout.expert_tp}: re-plan with etp 1"
        )
    if layout.moe_overlap == "none":
        return notes
    refusal = overlap_refusal(plan, layout)
    if refusal is not None:
        notes.append(
            f"{target}: the planned {layout.moe_overlap} A2A overlap is not exported: megatron-core's "
            f"overlap_moe_expert_parallel_comm refuses this layout ({refusal}); expect the dispatch exposed"
        )
    elif layout.moe_overlap == "dualpipe":
        notes.append(
            f"{target} has no DualPipe schedule; the A2A overlap is exported as megatron-core's 1F1B overlap "
            "(overlap_moe_expert_parallel_comm), which hides the dispatch of one micro-batch under another's compute"
        )
    return notes
