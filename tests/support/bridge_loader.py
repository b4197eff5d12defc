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
``transformer_engine.pytorch.optimizers.FusedAdam`` is a stand-in with TE 2.x's keyword
arguments, which megatron-core inspects before it allows the precision-aware optimizer.
No Bridge or megatron-core function is replaced.
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
        module.__version__ = "0.0"
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
        "position_embedding_type",
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


def main(cases_file: str) -> None:
    sys.meta_path.insert(0, _Stubs())
    import torch
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    for case in json.loads(open(cases_file).read()):
        os.environ["WORLD_SIZE"] = str(case["world_size"])
        device = types.SimpleNamespace(**case["device"])
        torch.cuda.get_device_properties = lambda *a, device=device, **k: device
        try:
            module, function = case["recipe"].rsplit(".", 1)
            cfg = getattr(importlib.import_module(f"megatron.bridge.recipes.{module}"), function)()
            cfg = process_config_with_overrides(cfg, config_filepath=case["override"])
            runtime_config_update(cfg)
            result = {"name": case["name"], "ok": True, "fields": _fields(cfg)}
        except Exception as exc:  # the loader's verdict, reported to the test
            lines = traceback.format_exception(exc)
            result = {"name": case["name"], "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                      "where": "".join(lines[-6:])[-3000:]}  # fmt: skip
        print(MARK + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
