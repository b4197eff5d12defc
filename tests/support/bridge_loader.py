"""Load ntp's Megatron-Bridge exports with Megatron-Bridge's own code, in its own environment.

Run as ``python bridge_loader.py CASES.json`` with Megatron-Bridge 0.3.1 and its pure-Python
dependencies first on PYTHONPATH (``make test-slow`` installs them under ``.venv/bridge``:
Bridge pins transformers<5, the main environment has 5). For each case it builds the recipe a
user would start from (``megatron.bridge.recipes.<module>.<function>()``; its Hugging Face
config.json comes from an offline hub cache the test writes), merges the exported YAML over it
with Bridge's ``process_config_with_overrides``, the function its training scripts call, runs
``runtime_config_update`` (what ``pretrain`` runs first: it resolves the mixed-precision recipe,
sets the data-parallel size and calls ``ConfigContainer.validate()``) with WORLD_SIZE set to the
plan's GPUs, and prints one JSON line per case: what it left in the fields ntp sets, or the error
it raised.

What is patched, and only that: GPU detection and the CUDA-only packages. The CUDA-only packages
Bridge imports at module level and this machine cannot install (``STUBBED``) import as empty
stand-ins, so no fused kernel exists; ``torch.cuda.get_device_properties``, which the MoE recipes
ask which dispatcher the GPU runs, answers with the case's GPU (``device``: name, major, minor);
the stand-in ``transformer_engine`` says it is ``TE_VERSION``, which megatron-core's fp8 checks
ask; ``transformer_engine.pytorch.optimizers.FusedAdam`` is a stand-in with TE 2.x's keyword
arguments, which megatron-core inspects before it allows the precision-aware optimizer.
No Bridge or megatron-core function is replaced.

With ``"build": true`` it then counts the parameters of the model the provider builds
(``provide()``) at TP = PP = 1 on the meta device in a one-rank gloo group, after every case is
checked (a process group would override WORLD_SIZE), with megatron-core's local layers
(``_built_params``; what it sets on the provider is ``_WHOLE``). For that build only:
megatron-core's TE detection in ``transformer_block`` (``get_cpu_offload_context``, which the
stand-in TE would offer) answers none, and ``torch.cuda.current_device`` answers ``"meta"``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import traceback
import types

# CUDA builds (transformer_engine, mamba_ssm, causal_conv1d, flash-linear-attention), and
# packages for multimodal data and experiment logging that the recipe modules import
TE_VERSION = "2.10.0"  # the stand-in TE's version, which megatron-core's fp8 checks ask (NGC PyTorch 25.11's)
MARK = "ntp-bridge-result "  # Bridge prints to stdout too: result lines carry this prefix

STUBBED = (
    "transformer_engine",
    "mamba_ssm",
    "causal_conv1d",
    "fla",
    "nvidia_resiliency_ext",
    "qwen_vl_utils",
    "open_clip",
    "timm",
    "wandb",
    "mlflow",
    "megatron.energon",
)


class _Anything(type):
    """A stand-in class: any attribute is another stand-in class; it can be subclassed and called."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(name, (), {"__init__": lambda self, *a, **k: None})

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __getitem__(cls, key):
        return cls


class _StandIn(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _Anything(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(self, name, value)
        return value


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if any(name == s or name.startswith(s + ".") for s in STUBBED):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandIn(spec.name)
        module.__path__ = []
        module.__version__ = TE_VERSION if spec.name == "transformer_engine" else "0.0"
        return module

    def exec_module(self, module):
        if module.__name__ == "transformer_engine.pytorch.optimizers":
            module.FusedAdam = _FusedAdam


class _FusedAdam:
    def __init__(self, params, lr=1e-3, *, master_weight_dtype=None, exp_avg_dtype=None,
                 exp_avg_sq_dtype=None, use_decoupled_grad=False, **kwargs):  # fmt: skip
        pass


def _fields(cfg) -> dict:
    m, mp = cfg.model, cfg.mixed_precision
    names = (
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
        "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel",
        "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
        "seq_length", "num_moe_experts", "moe_ffn_hidden_size", "moe_router_topk", "rotary_base", "layernorm_epsilon",
        "add_qkv_bias", "add_bias_linear", "gated_linear_unit", "share_embeddings_and_output_weights",
        "moe_aux_loss_coeff", "recompute_granularity", "bf16", "fp16", "fp8", "fp8_recipe", "params_dtype",
        "pipeline_dtype", "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "mtp_num_layers",
        "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage", "qk_layernorm", "normalization",
        "position_embedding_type", "glu_linear_offset", "activation_func_clamp_value", "qk_l2_norm",
        "layernorm_zero_centered_gamma", "rotary_percent", "no_rope_freq",
        # YaRN: a GPT provider's yarn_* fields, an MLA provider's unprefixed ones
        "yarn_rotary_scaling_factor", "yarn_original_max_position_embeddings", "yarn_beta_fast", "yarn_beta_slow",
        "yarn_correction_range_round_to_int", "yarn_mscale", "yarn_mscale_all_dim", "rope_type",
        "rotary_scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
        "mscale_all_dim",
    )  # fmt: skip
    out = {k: getattr(m, k, None) for k in names}
    out.update(
        data_parallel_size=cfg.data_parallel_size,
        global_batch_size=cfg.train.global_batch_size,
        micro_batch_size=cfg.train.micro_batch_size,
        dataset_seq_length=cfg.dataset.seq_length,
        use_distributed_optimizer=cfg.optimizer.use_distributed_optimizer,
        use_megatron_fsdp=cfg.ddp.use_megatron_fsdp,
        data_parallel_sharding_strategy=getattr(cfg.ddp, "data_parallel_sharding_strategy", None),
        ckpt_format=cfg.checkpoint.ckpt_format,
        grad_reduce_in_fp32=cfg.ddp.grad_reduce_in_fp32,
        mixed_precision=type(mp).__name__,
        activation=getattr(m.activation_func, "__name__", str(m.activation_func)),
    )
    return {k: (str(v) if k.endswith("dtype") or k == "fp8_recipe" else v) for k, v in out.items()}


# Set on the provider for the count (``_built_params``): one rank, no fused kernels, no streams,
# torch's LayerNorm (no zero-centred gamma), none of which holds a parameter; and no MTP module,
# whose Bridge spec asks for Transformer Engine's layers (the test adds ntp's count of it)
_WHOLE = dict(
    tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
    expert_model_parallel_size=1, expert_tensor_parallel_size=1, sequence_parallel=False,
    virtual_pipeline_model_parallel_size=None, pipeline_model_parallel_layout=None,
    num_layers_in_first_pipeline_stage=None, num_layers_in_last_pipeline_stage=None,
    account_for_embedding_in_pipeline_split=False, account_for_loss_in_pipeline_split=False,
    use_cpu_initialization=True, perform_initialization=False, moe_grouped_gemm=False, fp8=None, fp8_param=False,
    overlap_moe_expert_parallel_comm=False, apply_rope_fusion=False, masked_softmax_fusion=False,
    bias_activation_fusion=False, bias_dropout_fusion=False, gradient_accumulation_fusion=False,
    cross_entropy_loss_fusion=False, persist_layer_norm=False, moe_token_dispatcher_type="allgather",
    moe_shared_expert_overlap=False, should_pad_vocab=False, tp_comm_overlap=False,
    layernorm_zero_centered_gamma=False, mtp_num_layers=None,
)  # fmt: skip


def _free_port() -> int:
    """A TCP port no one listens on now (another run of the loaders, or of the suite, may hold any fixed one)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _built_params(model, vocab_size: int) -> int:
    """The parameters of the model the provider builds (``provide()``) at TP = PP = 1 on the meta
    device, with megatron-core's local layers (no Transformer Engine) and, for MLA, a parameterless
    stand-in of the attention kernel, whose local class takes no ``k_channels`` (megatron-core 0.16)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.process_groups_config import ProcessGroupCollection

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)

    class Kernel(torch.nn.Module):
        def __init__(self, **kwargs):
            super().__init__()

    def spec(config):
        block = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=config.normalization)
        if config.multi_latent_attention:
            for layer in block.layer_specs:
                layer.submodules.self_attention.submodules.core_attention = Kernel
        return block

    import megatron.core.transformer.transformer_block as block_module

    block_module.get_cpu_offload_context = None  # TE detection: the stand-in TE has no CPU offload
    for key, value in _WHOLE.items():
        setattr(model, key, value)
    if model.vocab_size is None:  # set from the tokenizer at run time (GPT-3's recipe): the plan's
        model.vocab_size = vocab_size
    model.transformer_layer_spec = spec
    model._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
    torch.cuda.current_device = lambda: "meta"  # where megatron-core puts buffers it makes on the GPU
    with torch.device("meta"):
        built = model.provide()
    return sum(p.numel() for p in built.parameters())


def _error(name: str, exc: Exception) -> dict:
    lines = traceback.format_exception(exc)
    return {"name": name, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
            "where": "".join(lines[-6:])[-3000:]}  # fmt: skip


def main(cases_file: str) -> None:
    sys.meta_path.insert(0, _Stubs())
    import torch
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    results, builds = [], []
    for case in json.loads(open(cases_file).read()):
        os.environ["WORLD_SIZE"] = str(case["world_size"])
        device = types.SimpleNamespace(**case["device"])
        torch.cuda.get_device_properties = lambda *a, device=device, **k: device
        try:
            module, function = case["recipe"].rsplit(".", 1)
            cfg = getattr(importlib.import_module(f"megatron.bridge.recipes.{module}"), function)()
            cfg = process_config_with_overrides(cfg, config_filepath=case["override"])
            runtime_config_update(cfg)
            results.append({"name": case["name"], "ok": True, "fields": _fields(cfg)})
            if case.get("build"):
                builds.append((results[-1], cfg.model, case["vocab_size"]))
        except Exception as exc:  # the loader's verdict, reported to the test
            results.append(_error(case["name"], exc))
    # after every check: once a process group exists, Bridge takes the world size from it, not WORLD_SIZE
    for result, model, vocab_size in builds:
        try:
            result["params_total"] = _built_params(model, vocab_size)
        except Exception as exc:
            result.update(_error(result["name"], exc), fields=result["fields"])
    for result in results:
        print(MARK + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
