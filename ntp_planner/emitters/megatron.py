"""Megatron-LM: a torchrun launch script for pretrain_gpt.py, the same arguments as JSON, and,
for a re-planned NTP state, the settings of Megatron's nonuniform-TP implementation.

Flag names follow megatron/training/arguments.py (shared/reference/formats.md). This module is
the only place in ntp-planner that spells them.
"""

from __future__ import annotations

import json
import shlex

from cost_models.layout import ParallelLayout
from ntp_planner.emitters.common import (
    Export,
    comment_safe,
    expressible_layout,
    launch_geometry,
    low_precision_fields,
    pipeline_split,
    sharding_fields,
    sharding_warnings,
)
from ntp_planner.emitters.moe import (
    FP8_ATTENTION_NOTE,
    MLA_YARN_DEFAULTS,
    attention_fields,
    model_fields,
    moe_fields,
    moe_warnings,
    position_type,
)
from ntp_planner.emitters.moe import yarn_notes as moe_yarn_notes
from ntp_planner.plan import Plan
from ntp_planner.replan_result import ReplanResult

VERSIONS = "Megatron-LM's pretrain_gpt.py (flags as megatron-core 0.19.2's megatron/training/arguments.py reads them)"
PRECISION = {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp8": ["--bf16"], "mxfp8": ["--bf16"], "nvfp4": ["--bf16"]}
# The optimisation settings of the launch, which a Plan does not hold (it plans parallelism, not
# training): a starting point to edit, not a recommendation for the model at hand. They are the
# Llama 2 pretraining recipe (Touvron et al. 2023, "Llama 2", section 2.2 and table 1, 7B/13B):
# AdamW at peak learning rate 3e-4, 2,000 warmup steps, cosine decay to 10% of the peak, weight
# decay 0.1, gradient clipping at 1.0. The recipe's beta2 0.95 and eps 1e-5 are not exported
# (Megatron's defaults, 0.999 and 1e-8, apply). --train-iters, --log-interval and --save-interval
# are placeholders of the usual order (Megatron-LM's examples/gpt3 script logs every 100 and saves
# every 10,000 of 500,000 iterations); nothing in ntp-planner depends on them.
TRAINING_HYPERPARAMETERS = (
    "--train-iters",
    "100000",  # placeholder: set the run's length
    "--lr",
    "3.0e-4",  # Llama 2 7B/13B peak learning rate (Touvron et al. 2023, table 1)
    "--min-lr",
    "3.0e-5",  # decayed to 10% of the peak (ibid., section 2.2)
    "--lr-decay-style",
    "cosine",  # ibid.
    "--lr-warmup-iters",
    "2000",  # ibid.
    "--clip-grad",
    "1.0",  # ibid.
    "--weight-decay",
    "0.1",  # ibid.
    "--log-interval",
    "10",  # placeholder
    "--save-interval",
    "1000",  # placeholder
)
# megatron-core config field -> Megatron-LM flag (emitters.common builds the fields)
FLAGS = {
    "virtual_pipeline_model_parallel_size": "--num-virtual-stages-per-pipeline-rank",
    "account_for_embedding_in_pipeline_split": "--account-for-embedding-in-pipeline-split",
    "account_for_loss_in_pipeline_split": "--account-for-loss-in-pipeline-split",
    "num_layers_in_first_pipeline_stage": "--decoder-first-pipeline-num-layers",
    "num_layers_in_last_pipeline_stage": "--decoder-last-pipeline-num-layers",
    "pipeline_model_parallel_layout": "--pipeline-model-parallel-layout",
    "use_distributed_optimizer": "--use-distributed-optimizer",
    "overlap_grad_reduce": "--overlap-grad-reduce",
    "overlap_param_gather": "--overlap-param-gather",
    "use_megatron_fsdp": "--use-megatron-fsdp",
    "data_parallel_sharding_strategy": "--data-parallel-sharding-strategy",
    "fp8": "--fp8-format",
    "fp8_recipe": "--fp8-recipe",
    "fp4": "--fp4-format",
    "fp4_recipe": "--fp4-recipe",
    "fp8_param_gather": "--fp8-param-gather",
    "fp4_param_gather": "--fp4-param-gather",
    # experts (emitters.moe.moe_fields)
    "num_moe_experts": "--num-experts",
    "moe_router_topk": "--moe-router-topk",
    "moe_router_pre_softmax": "--moe-router-pre-softmax",
    "moe_ffn_hidden_size": "--moe-ffn-hidden-size",
    "moe_grouped_gemm": "--moe-grouped-gemm",
    "moe_token_dispatcher_type": "--moe-token-dispatcher-type",
    "moe_flex_dispatcher_backend": "--moe-flex-dispatcher-backend",
    "expert_model_parallel_size": "--expert-model-parallel-size",
    "expert_tensor_parallel_size": "--expert-tensor-parallel-size",
    "overlap_moe_expert_parallel_comm": "--overlap-moe-expert-parallel-comm",
    "moe_layer_freq": "--moe-layer-freq",
    "moe_shared_expert_intermediate_size": "--moe-shared-expert-intermediate-size",
    # attention variants (emitters.moe.attention_fields)
    "multi_latent_attention": "--multi-latent-attention",
    "q_lora_rank": "--q-lora-rank",
    "kv_lora_rank": "--kv-lora-rank",
    "qk_head_dim": "--qk-head-dim",
    "qk_pos_emb_head_dim": "--qk-pos-emb-head-dim",
    "v_head_dim": "--v-head-dim",
    "mtp_num_layers": "--mtp-num-layers",
    "window_size": "--window-size",
    "window_attn_skip_freq": "--window-attn-skip-freq",
    "softmax_type": "--softmax-type",
    "qk_layernorm": "--qk-layernorm",
    "qk_l2_norm": "--qk-l2-norm",
    "no_rope_freq": "--no-rope-freq",
    # the model as its authors wrote it (emitters.moe.model_fields)
    "rotary_base": "--rotary-base",
    "rope_scaling": "--use-rope-scaling",
    "rope_scaling_factor": "--rope-scaling-factor",
    "layernorm_epsilon": "--norm-epsilon",
    "add_qkv_bias": "--add-qkv-bias",
    "moe_aux_loss_coeff": "--moe-aux-loss-coeff",
    "moe_router_score_function": "--moe-router-score-function",
    "moe_router_enable_expert_bias": "--moe-router-enable-expert-bias",
    "glu_linear_offset": "--glu-linear-offset",
    "activation_func_clamp_value": "--activation-func-clamp-value",
    "layernorm_zero_centered_gamma": "--apply-layernorm-1p",
    "rotary_percent": "--rotary-percent",
    # YaRN (emitters.moe.yarn_fields): the GPT model's yarn_* attributes (argument_utils'
    # _apply_yarn_config_from_args maps --rotary-scaling-factor, --mscale, --mscale-all-dim onto them),
    # MLATransformerConfig's unprefixed fields
    "yarn_rotary_scaling_factor": "--rotary-scaling-factor",
    "yarn_original_max_position_embeddings": "--yarn-original-max-position-embeddings",
    "yarn_beta_fast": "--yarn-beta-fast",
    "yarn_beta_slow": "--yarn-beta-slow",
    "yarn_correction_range_round_to_int": "--yarn-correction-range-round-to-int",
    "yarn_mscale": "--mscale",
    "yarn_mscale_all_dim": "--mscale-all-dim",
    "rope_type": "--rope-type",
    "rotary_scaling_factor": "--rotary-scaling-factor",
    "mscale": "--mscale",
    "mscale_all_dim": "--mscale-all-dim",
}
MLA_YARN_NOTE = (
    "Megatron-LM's command line has no flag for MLA's YaRN {fields}; megatron-core builds {name} with its defaults "
    "{defaults} instead: set them in pretrain_gpt.py's model provider to train the model exactly as written"
)


# Megatron-LM's command line gates the MLP with SiLU (--swiglu) or with quick GELU (--quick-geglu,
# x * sigmoid(1.702 x)); megatron-core's GELU gate (activation_func) has no flag
GEGLU_NOTE = (
    "Megatron-LM's command line has no GELU-gated MLP (GeGLU, {name}'s); the export asks for --quick-geglu, the "
    "same weights gated with x * sigmoid(1.702 x) instead of tanh-approximated GELU: set activation_func to "
    "GELU in pretrain_gpt.py's model provider to train the model exactly as written"
)


# What Megatron-LM 0.19.2's command line cannot build (no flag), by ModelSpec field
MISSING_NOTE = (
    "Megatron-LM's command line has no {what}, so the model it builds from this export lacks {name}'s {which}: "
    "add them in pretrain_gpt.py's model provider to train the model exactly as written"
)
# megatron-core's layer spec puts --qk-l2-norm's L2Norm in every layer; Llama 4 skips it where it skips rotary
L2_NOPE_NOTE = (
    "Megatron-LM's command line L2-normalises queries and keys in every layer (--qk-l2-norm), {name} only in its "
    "layers with rotary positions (not each {k}th): give the NoPE layers' attention no L2 norm in pretrain_gpt.py's "
    "model provider to train the model exactly as written"
)
# TransformerConfig.fp8_dot_product_attention is among the fields its argument code leaves out of the CLI
FP8_ATTENTION_WHY = "Megatron-LM 0.19.2's command line has no flag for it"


def missing_model_notes(m) -> list[str]:
    """What the model has that no Megatron-LM flag builds: Gemma's norms after each block, Gemma 2's
    attention and output logit soft-capping, OLMo 2's query and key norms over the whole projections
    (megatron-core's ``qk_layernorm`` norms each head with head_dim weights)."""
    whole_qk = m.qk_norm and m.qk_norm_span == "projection"
    lacks = [
        (m.post_norms, "norms after attention and after the MLP", "post-attention and post-MLP norms"),
        (whole_qk, "query/key norms over whole projections", "query and key norms (over all heads at once)"),
        (m.attention_softcap is not None, "attention logit soft-capping", f"attention soft-cap {m.attention_softcap}"),
        (m.final_softcap is not None, "output logit soft-capping", f"output soft-cap {m.final_softcap}"),
    ]
    lacks = [(what, which) for on, what, which in lacks if on]
    if not lacks:
        return []
    what = " nor ".join(w for w, _ in lacks)
    which = ", ".join(w for _, w in lacks)
    return [MISSING_NOTE.format(what=what, name=m.name, which=which)]


def flags(fields: dict) -> list[str]:
    """Megatron-LM arguments for megatron-core config fields: True -> the switch, False/None ->
    nothing, a value -> the flag and the value, a list as the Python list its parser evaluates
    (``moe_freq_type``), a tuple as comma-separated integers (``tuple_type``).

    >>> flags({"pipeline_model_parallel_layout": "Ettt|tttttL", "use_megatron_fsdp": False})
    ['--pipeline-model-parallel-layout', 'Ettt|tttttL']
    >>> flags({"moe_layer_freq": [0, 1, 1], "window_size": (127, 0)})
    ['--moe-layer-freq', '[0,1,1]', '--window-size', '127,0']
    """
    out = []
    for key, value in fields.items():
        if value is True:
            out.append(FLAGS[key])
        elif isinstance(value, list):
            out += [FLAGS[key], "[" + ",".join(map(str, value)) + "]"]
        elif isinstance(value, tuple):
            out += [FLAGS[key], ",".join(map(str, value))]
        elif value not in (False, None):
            out += [FLAGS[key], str(value)]
    return out


def pipeline_split_args(layout: ParallelLayout, num_layers: int, mtp_layers: int = 0) -> list[str]:
    """Where the layers live, as Megatron-LM's pipeline flags (``common.pipeline_split``).

    >>> pipeline_split_args(ParallelLayout(pp=2, dp=1, global_batch=1, pp_layers=(3, 5)), 8)
    ['--pipeline-model-parallel-layout', 'Ettt|tttttL']
    """
    return flags(pipeline_split(layout, num_layers, mtp_layers))


def model_args_fields(m) -> dict:
    """``model_fields`` less what the arguments say elsewhere (the position type) or cannot say (MLA's
    YaRN ramp settings, ``yarn_notes``)."""
    fields = model_fields(m)
    for key in ("position_embedding_type", *MLA_YARN_DEFAULTS):
        fields.pop(key, None)
    return fields


def yarn_notes(m) -> list[str]:
    """MLA's YaRN settings Megatron-LM cannot pass, where they differ from megatron-core's defaults."""
    if m.yarn is None or not m.is_mla:
        return []
    fields = model_fields(m)
    off = {k: fields[k] for k, v in MLA_YARN_DEFAULTS.items() if fields[k] != v}
    notes = moe_yarn_notes(m, "Megatron-LM")
    if off:
        defaults = {k: MLA_YARN_DEFAULTS[k] for k in off}
        notes.append(MLA_YARN_NOTE.format(fields=off, name=m.name, defaults=defaults))
    return notes


def megatron_args(
    plan: Plan, layout: ParallelLayout, data_path: str | None = None, save_dir: str | None = None
) -> list[str]:
    """pretrain_gpt.py arguments for ``layout`` (a table walk: our vocabulary -> Megatron's)."""
    m, t = plan.model, plan.training
    args = [
        "--tensor-model-parallel-size",
        str(layout.tp),
        "--pipeline-model-parallel-size",
        str(layout.pp),
        "--context-parallel-size",
        str(layout.cp),
        "--micro-batch-size",
        str(layout.micro_batch),
        "--global-batch-size",
        str(layout.global_batch),
        "--num-layers",
        str(m.num_layers),
        "--hidden-size",
        str(m.hidden_size),
        "--ffn-hidden-size",
        str(m.ffn_hidden_size),
        "--num-attention-heads",
        str(m.num_heads),
        "--kv-channels",
        str(m.head_dim),
        "--seq-length",
        str(t.seq_len),
        "--max-position-embeddings",
        str(max(m.max_position_embeddings, t.seq_len) if m.position == "rope" else m.max_position_embeddings),
        "--position-embedding-type",
        position_type(m),
        "--normalization",
        "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm",
        "--attention-dropout",
        str(m.dropout),
        "--hidden-dropout",
        str(m.dropout),
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        str(m.vocab_size),
    ]
    switches = [
        ("--group-query-attention", m.num_kv_heads < m.num_heads),
        ("--swiglu", m.gated_mlp and m.gate_activation == "silu"),
        ("--quick-geglu", m.gated_mlp and m.gate_activation in ("gelu", "quick_gelu")),  # GEGLU_NOTE for gelu
        ("--squared-relu", not m.gated_mlp and m.mlp_activation == "squared_relu"),
        ("--disable-bias-linear", not m.bias),
        ("--untie-embeddings-and-output-weights", not m.tie_embeddings),
        ("--sequence-parallel", layout.sequence_parallel),
        ("--tp-comm-overlap", layout.tp_comm_overlap),
        ("--grad-reduce-in-bf16", t.grad_bytes == 2 and t.dtype != "fp16"),
        ("--use-precision-aware-optimizer", t.precision_aware_optimizer),
        ("--cross-entropy-loss-fusion", t.fused_cross_entropy),
        ("--no-rope-fusion", not t.rope_fusion),  # Megatron-LM fuses RoPE unless told (apply_rope_fusion)
    ]
    args += [flag for flag, on in switches if on]
    args += flags(sharding_fields(layout))
    if layout.zero >= 2:  # Megatron-FSDP saves only this format ("requires the fsdp_dtensor checkpointing format")
        args += ["--ckpt-format", "fsdp_dtensor"]
    if m.num_kv_heads < m.num_heads:
        args += ["--num-query-groups", str(m.num_kv_heads)]
    args += PRECISION[t.dtype] + flags(low_precision_fields(plan))
    if layout.vpp > 1 and not layout.overlap_p2p:  # overlap is Megatron-LM's default; only its opt-out exists
        args += ["--no-overlap-p2p-communication"]
    args += pipeline_split_args(layout, m.num_layers, m.mtp_layers)
    if layout.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    elif layout.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    args += flags(moe_fields(plan, layout)) + flags(attention_fields(m)) + flags(model_args_fields(m))
    if m.yarn is not None and not m.is_mla and not m.yarn.truncate:  # the switch is on by default
        args += ["--no-yarn-correction-range-round-to-int"]
    args += user_value("--data-path", data_path) if data_path else ["--mock-data"]
    checkpoints = save_dir or f"checkpoints/{m.name}"
    args += [*user_value("--save", checkpoints), *user_value("--load", checkpoints), *TRAINING_HYPERPARAMETERS]
    return args


def user_value(flag: str, value: str) -> list[str]:
    """A flag and a value the user typed: two arguments, or one ``--flag=value`` when the value
    starts with a dash, which argparse would otherwise read as the next option.

    >>> user_value("--data-path", "/data/corpus"), user_value("--data-path", "--x")
    (['--data-path', '/data/corpus'], ['--data-path=--x'])
    """
    return [f"{flag}={value}"] if value.startswith("-") else [flag, value]


def connections(args: list[str]) -> list[str]:
    """The CUDA_DEVICE_MAX_CONNECTIONS line: 1 (one hardware queue, so TP/CP communication kernels
    start in issue order, which Megatron-LM asserts before Blackwell), except under Megatron-FSDP,
    whose overlapped gathers need several queues ("FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or
    unset"): then it is unset, and Megatron-LM only warns when TP or CP is on as well.

    >>> connections([]), connections(["--use-megatron-fsdp"])
    (['export CUDA_DEVICE_MAX_CONNECTIONS=1'], ['unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP needs several'])
    """
    if "--use-megatron-fsdp" in args:
        return ["unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP needs several"]
    return ["export CUDA_DEVICE_MAX_CONNECTIONS=1"]


def launch_script(plan: Plan, args: list[str]) -> str:
    """torchrun on every host, then ``args`` as they are: every one is shell-quoted, so the
    program receives exactly this argument vector whatever a value holds (``;``, ``$(...)``,
    quotes, newlines). Flags start lines, for reading only."""
    hosts, per_host = launch_geometry(plan)
    header = (
        f"# ntp-planner plan {plan.inputs_hash[:12]}: {plan.model.name} on {plan.cluster.num_gpus} x "
        f"{plan.cluster.spec.gpu} ({plan.cluster.spec.name})"
    )
    lines = [
        "#!/usr/bin/env bash",
        comment_safe(header),
        f"# for {VERSIONS}",
        "# Run on every host with NODE_RANK set; MASTER_ADDR is host 0. MEGATRON_LM points at a checkout.",
        "set -euo pipefail",
        *connections(args),
        f"NNODES=${{NNODES:-{hosts}}}",
        "NODE_RANK=${NODE_RANK:-0}",
        "MASTER_ADDR=${MASTER_ADDR:-localhost}",
        "MASTER_PORT=${MASTER_PORT:-29500}",
        "MEGATRON_LM=${MEGATRON_LM:-.}",
        f'torchrun --nproc_per_node {per_host} --nnodes "$NNODES" --node_rank "$NODE_RANK" \\',
        '    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" "$MEGATRON_LM/pretrain_gpt.py" \\',
    ]
    words: list[list[str]] = []  # one line per flag and its value
    for arg in args:
        if not words or arg.startswith("--") or len(words[-1]) == 2:
            words.append([])
        words[-1].append(shlex.quote(arg))
    body = ["    " + " ".join(line) for line in words]
    return "\n".join(lines + [line + " \\" for line in body[:-1]] + body[-1:]) + "\n"


def _expert_warnings(replan: ReplanResult) -> list[str]:
    """What Megatron's nonuniform TP cannot express of an MoE re-plan: it keeps every EP group whole."""
    hosted = [x for x in replan.experts if x.mode == "rehosted"]
    dropped = [x for x in replan.experts if x.mode == "dropped"]
    out = []
    if hosted:
        moved = sum(x.moved_bytes for x in hosted) / 2**30
        most = max(x.load_factor for x in hosted)
        out.append(
            f"{len(hosted)} EP groups re-host the experts of ranks that no longer run (the busiest survivor at up to "
            f"{most:.3g}x its experts, {moved:.1f} GiB of expert state moved); Megatron's nonuniform TP keeps EP "
            "groups whole and has no setting for it, so these settings cover the attention's TP only: relaunch "
            "Megatron with the replicas of those groups dropped, or run the re-plan's hosting (ReplanResult.experts)"
        )
    if dropped:
        out.append(f"{len(dropped)} EP groups are dropped with every replica they span")
    return out


# nonuniform_tp.json holds exactly NonuniformTPConfig's fields (Megatron-LM dev,
# megatron/core/distributed/nonuniform_tp.py); JSON has no tuple keys, so each
# (dp, cp, pp) key is written "dp,cp,pp" and this loader, written beside it, makes the config.
NTP_LOADER = '''"""Megatron-LM's NonuniformTPConfig for this re-plan, from nonuniform_tp.json beside this file.

Megatron keys non_active_ranks_per_dp by (dp, cp, pp) tuples; JSON writes them "dp,cp,pp".
Needs Megatron-LM with megatron/core/distributed/nonuniform_tp.py (its dev branch, 2026).
"""

import json
from pathlib import Path


def settings() -> dict:
    """The config's fields, keys as Megatron's tuples."""
    data = json.loads(Path(__file__).with_name("nonuniform_tp.json").read_text())
    data["non_active_ranks_per_dp"] = {
        tuple(int(i) for i in key.split(",")): ranks for key, ranks in data["non_active_ranks_per_dp"].items()
    }
    return data


def ntp_config():
    from megatron.core.distributed.nonuniform_tp import NonuniformTPConfig

    return NonuniformTPConfig(**settings())
'''


def nonuniform_tp_settings(plan: Plan, replan: ReplanResult) -> tuple[dict, list[str]]:
    """Settings of Megatron's nonuniform-TP config for a re-planned state: reduced replicas come
    first in Megatron's rank order, so replicas are renumbered degraded-first."""
    lay = plan.layout
    degraded = [r for r in replan.replicas if r.status == "degraded" and min(r.stage_tp) < lay.tp]
    warnings = _expert_warnings(replan)
    if not degraded:
        none = {"tp_base": lay.tp, "tp_spares": 0, "num_reduced_tp_dp_ranks": 0, "non_active_ranks_per_dp": {}}
        return none, warnings
    reduced = min(min(r.stage_tp) for r in degraded)
    if len({t for r in degraded for t in r.stage_tp}) > 1:
        warnings.append(
            f"degraded replicas run different TP degrees; Megatron's nonuniform TP takes one, so all "
            f"reduced replicas are exported at TP{reduced}"
        )
    order = [r.replica for r in degraded] + [r.replica for r in replan.replicas if r.status != "degraded"]
    inactive, grid = {}, lay.rank_grid
    for new_dp, old_dp in enumerate(order[: len(degraded)]):
        for s in range(lay.pp):
            for c in range(lay.cp):
                tp_group = grid.group("tp", grid.rank(cp=c, dp=old_dp, pp=s))
                slots = [i for i, rank in enumerate(tp_group) if replan.rank_to_gpu[rank] is None]
                inactive[f"{new_dp},{c},{s}"] = slots[: lay.tp - reduced] if slots else list(range(reduced, lay.tp))
    dropped = [r.replica for r in replan.replicas if r.status == "dropped"]
    if dropped:
        warnings.append(f"{len(dropped)} replicas are dropped; relaunch with dp reduced by {len(dropped)}")
    settings = {
        "tp_base": lay.tp,
        "tp_spares": lay.tp - reduced,
        "num_reduced_tp_dp_ranks": len(degraded),
        "non_active_ranks_per_dp": inactive,
    }
    return settings, warnings


def emit(
    plan: Plan, replan: ReplanResult | None = None, data_path: str | None = None, save_dir: str | None = None
) -> Export:
    layout, warnings = expressible_layout(plan, "Megatron-LM")
    warnings += sharding_warnings(layout, "Megatron-LM") + moe_warnings(plan, layout, "Megatron-LM")
    if plan.model.gated_mlp and plan.model.gate_activation == "gelu":
        warnings.append(GEGLU_NOTE.format(name=plan.model.name))
    warnings += missing_model_notes(plan.model) + yarn_notes(plan.model)
    if plan.model.qk_l2_norm and plan.model.nope_every:
        warnings.append(L2_NOPE_NOTE.format(name=plan.model.name, k=plan.model.nope_every))
    if plan.training.fp8_attention:
        how = "(TransformerConfig) in pretrain_gpt.py's model provider"
        warnings.append(FP8_ATTENTION_NOTE.format(target="Megatron-LM", why=FP8_ATTENTION_WHY, how=how))
    args = megatron_args(plan, layout, data_path, save_dir)
    out = Export(warnings=warnings)
    out.files["launch_megatron.sh"] = launch_script(plan, args)
    out.files["megatron_args.json"] = json.dumps(args, indent=1) + "\n"
    if replan is not None:
        settings, more = nonuniform_tp_settings(plan, replan)
        out.files["nonuniform_tp.json"] = json.dumps(settings, indent=1) + "\n"
        out.files["nonuniform_tp_config.py"] = NTP_LOADER
        out.warnings += more
    return out
