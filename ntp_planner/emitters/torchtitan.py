"""torchtitan 0.3.0: a config-registry module (``torchtitan_config.py``) and a torchrun launch script.

torchtitan 0.3 reads no TOML job file (``--job.config_file`` is gone): ``torchtitan.train`` builds
its ``Trainer.Config`` with ``ConfigManager`` from ``--module M --config F``, a function ``F`` of
module ``M`` that returns the config, then applies ``--section.field`` overrides. The export is
such a module: ``ntp_plan()`` starts from torchtitan's own recipe for the model (``llama3_70b()``:
its optimizer, learning rate, dataset, tokenizer path) and sets what the plan decides.

Field names follow torchtitan 0.3.0's ``config/configs.py`` (``TrainingConfig``,
``ParallelismConfig``, ``CompileConfig``), ``trainer.py`` (``Trainer.Config``),
``distributed/activation_checkpoint.py`` and ``components/quantization``. This module is the only
place in ntp-planner that spells them.
"""

from __future__ import annotations

import pprint
import shlex
from typing import NamedTuple

from cost_models.layout import ParallelLayout
from ntp_planner.emitters.common import Export, comment_safe, expressible_layout, launch_geometry
from ntp_planner.plan import Plan
from ntp_planner.replan_result import ReplanResult
from topologies.errors import InputError


class TitanModel(NamedTuple):
    """A model torchtitan 0.3.0 ships: ``torchtitan.models.<module>``, its ``model_registry``
    flavor, the recipe in its ``config_registry``, and the layer count that flavor builds."""

    module: str
    flavor: str
    recipe: str
    num_layers: int


# catalogue model -> torchtitan's model (torchtitan/models/<module>/__init__.py and config_registry.py)
MODELS = {
    "llama3-8b": TitanModel("llama3", "8B", "llama3_8b", 32),
    "llama3-70b": TitanModel("llama3", "70B", "llama3_70b", 80),
    "llama3.1-405b": TitanModel("llama3", "405B", "llama3_405b", 126),
    "deepseek-v3": TitanModel("deepseek_v3", "671B", "deepseek_v3_671b", 61),
    "qwen3-30b-a3b": TitanModel("qwen3", "30B-A3B", "qwen3_30b_a3b", 48),
    "gpt-oss-20b": TitanModel("gpt_oss", "20b", "gpt_oss_20b", 24),
    "gpt-oss-120b": TitanModel("gpt_oss", "120b", "gpt_oss_120b", 36),
}
CONFIG_MODULE, CONFIG_FUNCTION = "torchtitan_config", "ntp_plan"
LAUNCH = "launch_torchtitan.sh"
# torchtitan's recompute policies (Trainer.Config.activation_checkpoint: a tyro subcommand each)
ACTIVATION_CHECKPOINT = {"none": None, "selective": "SelectiveAC.Config()", "full": "FullAC.Config()"}
# number format -> (converter of the linear layers, converter of the routed experts' grouped GEMMs),
# as torchtitan's own recipes configure them (llama3_405b, deepseek_v3_671b_float8, llama3_8b_mxfp8,
# llama3_debugmodel_nvfp4), compiled as the export compiles the model. The LM head stays in bf16, as
# the cost model has it: float8 skips it (and, for MoE, the router) by name; mxfp8 and nvfp4 convert
# only what their ``fqns`` name, here the transformer layers.
_COMPILED = "model_compile_enabled=True"
CONVERTERS = {
    "fp8": (f"Float8LinearConverter.Config(recipe_name='rowwise', filter_fqns={{skip!r}}, {_COMPILED})",
            f"Float8GroupedExpertsConverter.Config({_COMPILED})"),
    "mxfp8": (f"MXFP8LinearConverter.Config(fqns=['layers'], {_COMPILED})",
              f"MXFP8GroupedExpertsConverter.Config({_COMPILED})"),
    "nvfp4": (f"NVFP4LinearConverter.Config(fqns=['layers'], {_COMPILED})", None),
}  # fmt: skip
STEPS = 100_000  # placeholder, as Megatron's --train-iters: set the run's length


def titan_model(plan: Plan) -> TitanModel:
    """torchtitan's model for the plan's, or a refusal naming the ones it has."""
    m = plan.model
    found = MODELS.get(m.name)
    if found is None:
        raise InputError(
            f"torchtitan 0.3.0 has no model for {m.name!r}; it has {', '.join(MODELS)} (as "
            "torchtitan.models llama3, deepseek_v3, qwen3, gpt_oss): export with another --format"
        )
    if found.num_layers != m.num_layers:
        raise InputError(
            f"{m.name} has {m.num_layers} layers but torchtitan's {found.module} {found.flavor} has "
            f"{found.num_layers}; torchtitan builds its own model, so export a plan of the catalogue's {m.name}"
        )
    return found


def check_expressible(plan: Plan, layout: ParallelLayout) -> None:
    """Refuse what torchtitan 0.3.0 cannot run: fp16, and an expert grid other than its own. Its
    experts split over the TP ranks when ep is 1 and not at all when ep > 1 (EP borrows the TP
    ranks: ``efsdp = dp_shard * cp * tp / ep``, ParallelismConfig.expert_parallel_degree)."""
    if plan.training.dtype == "fp16":
        raise InputError(
            "torchtitan 0.3.0 trains in bfloat16 or float32 (training.mixed_precision_param), not fp16; "
            "re-plan with --dtype bf16"
        )
    if not plan.model.is_moe:
        return
    if layout.ep == 1 and layout.expert_tp != layout.tp:
        raise InputError(
            f"torchtitan splits experts over the TP ranks when ep is 1, so etp({layout.expert_tp}) must equal "
            f"tp({layout.tp}); re-plan with etp unset"
        )
    if layout.ep > 1 and layout.expert_tp != 1:
        raise InputError(
            f"torchtitan 0.3.0 runs experts unsplit (expert TP 1) when ep({layout.ep}) > 1, its EP borrowing the "
            f"TP ranks, but the plan has etp({layout.expert_tp}); re-plan with etp 1"
        )
    shard = data_parallel(layout)[0]["data_parallel_shard_degree"]
    if layout.ep > 1 and (shard * layout.cp * layout.tp) % layout.ep:
        raise InputError(
            f"torchtitan carves EP out of dp_shard({shard}) * cp({layout.cp}) * tp({layout.tp}) = "
            f"{shard * layout.cp * layout.tp} ranks, which ep({layout.ep}) does not divide (a ZeRO-0 plan "
            "replicates over dp, so dp_shard is 1); re-plan with zero 1 or more"
        )


def data_parallel(layout: ParallelLayout) -> tuple[dict, list[str]]:
    """FSDP2 degrees. ZeRO >= 1 shards over all dp (``data_parallel_shard_degree``; the plan has no
    HSDP, so nothing replicates); ZeRO-0 replicates (``data_parallel_replicate_degree``). torchtitan
    has no ZeRO-1/2: its FSDP2 shards the weights too, and keeping them gathered from forward to
    backward (``fsdp_reshard_after_forward = 'never'``) is the nearest it runs."""
    sharded = layout.zero >= 1
    keep = layout.zero in (1, 2) or not layout.reshard_after_forward
    fields = {
        "data_parallel_replicate_degree": 1 if sharded else layout.dp,
        "data_parallel_shard_degree": layout.dp if sharded else 1,
        "fsdp_reshard_after_forward": "never" if keep else "always",
    }
    warnings = []
    if layout.zero in (1, 2):
        warnings.append(
            f"torchtitan has no ZeRO-{layout.zero}: its FSDP2 shards the weights as well, so the plan is exported as "
            "FSDP over dp keeping the gathered weights from forward to backward (fsdp_reshard_after_forward "
            "'never'): expect weight all-gathers per micro-batch that the plan does not count"
        )
    if layout.zero == 0 and layout.cp > 1:
        warnings.append(
            f"torchtitan shards the weights over the cp({layout.cp}) ranks even without ZeRO (its FSDP mesh "
            "includes cp): expect weight all-gathers the ZeRO-0 plan does not count"
        )
    return fields, warnings


def model_parts(plan: Plan) -> list[list[str]]:
    """``module_fqns_per_model_part``: the plan's chunks in model order, each the FQNs of the
    modules it holds (torchtitan's decoder names: tok_embeddings, layers.<i>, norm, lm_head).
    torchtitan puts part c on pipeline rank c % pp (its "loop" style), as the plan does.

    >>> from cost_models import ParallelLayout as L
    >>> from ntp_planner.plan import chunk_placements
    >>> plan = type("P", (), {"pipeline": chunk_placements(L(pp=2, global_batch=2, pp_layers=(1, 2)), 3)})
    >>> model_parts(plan)
    [['tok_embeddings', 'layers.0'], ['layers.1', 'layers.2', 'norm', 'lm_head']]
    """
    parts = []
    for chunk in plan.pipeline:
        names = ["tok_embeddings"] if chunk.embedding else []
        names += [f"layers.{i}" for i in chunk.layers]
        names += ["norm", "lm_head"] if chunk.loss else []
        parts.append(names)
    return parts


def batch_fields(layout: ParallelLayout) -> dict:
    """Batch sizes in torchtitan's terms. Without PP a data-parallel rank runs one micro-batch per
    gradient-accumulation step (``local_batch_size`` = micro_batch; torchtitan accumulates
    global / (local * dp) of them). With PP every micro-batch of the step goes through one
    pipeline schedule, as in the plan: ``local_batch_size`` = global / dp, split into micro-batches
    of ``pipeline_parallel_microbatch_size``, so one accumulation step.

    >>> list(batch_fields(ParallelLayout(pp=2, dp=4, micro_batch=2, global_batch=64)).values())  # local, global, mb
    [16, 64, 2]
    """
    local = layout.global_batch // layout.dp if layout.pp > 1 else layout.micro_batch
    return {
        "training.local_batch_size": local,
        "training.global_batch_size": layout.global_batch,
        "parallelism.pipeline_parallel_microbatch_size": layout.micro_batch,
    }


def config_fields(plan: Plan, layout: ParallelLayout, data_path: str | None, save_dir: str | None) -> dict:
    """Every value the module sets, by its dotted path in ``Trainer.Config``."""
    t = plan.training
    replicas, _ = data_parallel(layout)
    fields = {f"parallelism.{k}": v for k, v in replicas.items()}
    fields |= {
        "parallelism.tensor_parallel_degree": layout.tp,
        "parallelism.enable_sequence_parallel": layout.sequence_parallel,
        "parallelism.context_parallel_degree": layout.cp,
        "parallelism.pipeline_parallel_degree": layout.pp,
        "parallelism.expert_parallel_degree": layout.ep,
    }
    if layout.pp > 1:
        fields["parallelism.pipeline_parallel_schedule"] = "Interleaved1F1B" if layout.vpp > 1 else "1F1B"
        fields["parallelism.module_fqns_per_model_part"] = model_parts(plan)
    fields |= batch_fields(layout)
    fields |= {
        "training.seq_len": t.seq_len,
        "training.steps": STEPS,
        "training.mixed_precision_param": "bfloat16",  # the plan's 16-bit weights (fp16 is refused)
        "training.mixed_precision_reduce": "float32",  # the only reduction torchtitan 0.3.0 has
        "training.disable_cuda_graphs": not t.cuda_graphs or layout.pp > 1 or layout.ep > 1,
        # torch.compile gives the fused kernels the plan costs, and async TP needs it
        "compile.enable": True,
        "compile.components": ["model", "loss"],
        "compile.enable_async_tensor_parallel": layout.tp_comm_overlap and layout.tp > 1,
    }
    if data_path:
        fields["dataloader.dataset_path"] = data_path
    if save_dir:
        fields |= {"checkpoint.enable": True, "checkpoint.folder": save_dir}
    return fields


def converter_calls(plan: Plan) -> list[str]:
    """The model converters of the plan's number format (none for bf16), as Python calls."""
    dtype = plan.training.dtype
    if dtype not in CONVERTERS:
        return []
    linear, experts = CONVERTERS[dtype]
    skip = ["lm_head", "router.gate"] if plan.model.is_moe else ["lm_head"]
    calls = [linear.format(skip=skip)]
    if plan.model.is_moe and experts:
        calls.append(experts)
    return calls


def warnings_for(plan: Plan, layout: ParallelLayout) -> list[str]:
    """What the export cannot carry as planned, one sentence each."""
    t, m = plan.training, plan.model
    notes = [
        (layout.recompute == "selective", "torchtitan's selective activation checkpointing is per op (it keeps "
         "attention and every other matmul and recomputes the rest), not the core-attention recomputation the "
         "plan costs: expect more recomputation and less activation memory than predicted"),
        (bool(layout.recompute_modules), f"torchtitan has no recompute modules; {list(layout.recompute_modules)} "
         "are not exported"),
        (t.grad_bytes == 2, "torchtitan 0.3.0 reduces gradients in float32 only (training.mixed_precision_reduce): "
         "the plan's 16-bit reduction is exported as float32, twice the data-parallel traffic"),
        (t.dtype == "fp8", f"torchtitan 0.3.0 scales float8 row-wise only (recipe 'rowwise'): the plan's "
         f"{t.fp8_recipe} per-tensor scaling is exported as row-wise"),
        (t.fp8_params, "torchtitan 0.3.0 gathers weights in bf16: the plan's low-precision weight all-gather "
         "(fp8_params) is not exported"),
        (t.fp8_attention, "torchtitan 0.3.0 has no fp8 attention (its float8 converters convert linear layers): "
         "the plan's fp8 attention is not exported, so expect attention in bf16, slower than predicted"),
        (t.dtype == "nvfp4" and m.is_moe, "torchtitan 0.3.0 has no nvfp4 experts: the experts run in bf16"),
        (t.cuda_graphs and (layout.pp > 1 or layout.ep > 1), "torchtitan 0.3.0 captures no CUDA graphs with "
         "pipeline parallelism, nor with the recipe's expert dispatcher: they are disabled "
         "(training.disable_cuda_graphs)"),
        (m.mtp_layers > 0, f"torchtitan's {MODELS[m.name].recipe} recipe trains without the model's "
         f"{m.mtp_layers} multi-token prediction layer(s): they are not exported"),
        (m.is_moe and layout.moe_dispatcher != "alltoall", f"torchtitan: the planned {layout.moe_dispatcher} "
         "dispatcher is not exported; the recipe's all-to-all runs (model_registry's moe_comm_backend)"),
        (layout.moe_overlap != "none", f"torchtitan has no {layout.moe_overlap} A2A overlap: expect the dispatch "
         "exposed"),
    ]  # fmt: skip
    return data_parallel(layout)[1] + [text for on, text in notes if on] + runtime_warning(plan)


def runtime_warning(plan: Plan) -> list[str]:
    """A plan costed for another runtime than torchtitan's (``Plan.runtime``) says so."""
    if plan.runtime == "torchtitan":
        return []
    return [
        f"the plan's step time and memory were costed for the {plan.runtime} runtime, not torchtitan's: cost it "
        "again with `ntp estimate --runtime torchtitan` (or plan with `ntp plan --runtime torchtitan`)"
    ]


def _literal(value) -> str:
    """``value`` as a Python literal; a list of lists (the pipeline parts) one inner list a line."""
    if isinstance(value, list) and value and isinstance(value[0], list):
        rows = [pprint.pformat(part, width=108, compact=True).replace("\n", "\n" + " " * 9) for part in value]
        return "[\n" + "".join(f"        {row},\n" for row in rows) + "    ]"
    return repr(value)


def config_module(plan: Plan, layout: ParallelLayout, fields: dict, titan: TitanModel) -> str:
    """The text of ``torchtitan_config.py``: imports, then ``ntp_plan()`` setting every field."""
    ac = ACTIVATION_CHECKPOINT[layout.recompute]
    converters = converter_calls(plan)
    imports = []
    if converters:
        names = sorted({call.split(".")[0] for call in converters})
        imports.append(f"from torchtitan.components.quantization import {', '.join(names)}")
    if ac:
        imports.append(f"from torchtitan.distributed.activation_checkpoint import {ac.split('.')[0]}")
    imports += [
        f"from torchtitan.models.{titan.module} import model_registry",
        f"from torchtitan.models.{titan.module}.config_registry import {titan.recipe}",
    ]
    spec = f"model_registry({titan.flavor!r})"
    if converters:
        spec = f"model_registry(\n        {titan.flavor!r},\n        converters=[\n"
        spec += "".join(f"            {call},\n" for call in converters) + "        ],\n    )"
    lines = [f"    config = {titan.recipe}()", f"    config.model_spec = {spec}"]
    lines.append(f"    config.activation_checkpoint = {ac}")
    lines += [f"    config.{path} = {_literal(value)}" for path, value in fields.items()]
    title = comment_safe(f"{plan.model.name}, {layout.describe()}").replace("\\", "/").replace('"', "'")
    hosts, per_host = launch_geometry(plan)
    return f'''"""torchtitan 0.3.0 job config from ntp-planner plan {plan.inputs_hash[:12]}: {title}.

Run {LAUNCH} on each of the {hosts} hosts, or, with this folder on PYTHONPATH:
    torchrun --nproc_per_node {per_host} ... -m torchtitan.train --module {CONFIG_MODULE} --config {CONFIG_FUNCTION}
Optimizer, learning-rate schedule, dataset and tokenizer path are those of torchtitan's {titan.recipe}
recipe; training.steps is a placeholder. Pipeline part c runs on pipeline rank c % pp ({layout.vpp} per rank).
"""

{chr(10).join(imports)}


def {CONFIG_FUNCTION}():
    """torchtitan's {titan.recipe} recipe with the plan's parallelism, batch sizes and precision."""
{chr(10).join(lines)}
    return config
'''


def launch_script(plan: Plan) -> str:
    """torchrun on every host, running ``torchtitan.train`` on the exported config module; extra
    arguments are passed on (torchtitan's ``--section.field value`` overrides)."""
    hosts, per_host = launch_geometry(plan)
    header = (
        f"# ntp-planner plan {plan.inputs_hash[:12]}: {plan.model.name} on {plan.cluster.num_gpus} x "
        f"{plan.cluster.spec.gpu} ({plan.cluster.spec.name})"
    )
    module = shlex.join(["--module", CONFIG_MODULE, "--config", CONFIG_FUNCTION])
    lines = [
        "#!/usr/bin/env bash",
        comment_safe(header),
        "# Run on every host with NODE_RANK set; MASTER_ADDR is host 0. Needs torchtitan 0.3.0 installed.",
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        'export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"',
        f"NNODES=${{NNODES:-{hosts}}}",
        "NODE_RANK=${NODE_RANK:-0}",
        "MASTER_ADDR=${MASTER_ADDR:-localhost}",
        "MASTER_PORT=${MASTER_PORT:-29500}",
        f'torchrun --nproc_per_node {per_host} --nnodes "$NNODES" --node_rank "$NODE_RANK" \\',
        '    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \\',
        f'    -m torchtitan.train {module} "$@"',
    ]
    return "\n".join(lines) + "\n"


def emit(
    plan: Plan, replan: ReplanResult | None = None, data_path: str | None = None, save_dir: str | None = None
) -> Export:
    titan = titan_model(plan)
    layout, warnings = expressible_layout(plan, "torchtitan")
    check_expressible(plan, layout)
    fields = config_fields(plan, layout, data_path, save_dir)
    files = {f"{CONFIG_MODULE}.py": config_module(plan, layout, fields, titan), LAUNCH: launch_script(plan)}
    return Export(files=files, warnings=warnings + warnings_for(plan, layout))
