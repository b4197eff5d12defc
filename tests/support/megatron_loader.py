"""Load ntp's Megatron-LM exports with Megatron-LM's own argument code, in its own folder.

Run as ``python megatron_loader.py CASES.json`` with megatron-core 0.19.2 first on PYTHONPATH
(``make test-slow`` installs it under ``.venv/megatron``: the main environment pins 0.16, which
has no ``megatron/training``). For each case it does what ``pretrain_gpt.py`` does before it
touches a GPU: sets the environment the launch script exports, calls
``megatron.training.arguments.parse_args`` on the exported argv and ``validate_args`` on the
result with WORLD_SIZE set to the plan's GPUs, and prints one JSON line per case: the fields
ntp sets as Megatron left them, or the error (argparse's message, or the failed assertion).
With ``"build": true`` it then builds the model Megatron would train, on the meta device:
``core_transformer_config_from_args`` and ``GPTModel`` with megatron-core's local layer spec
(no Transformer Engine), at TP = PP = 1 in a one-rank gloo group, with the vocabulary unpadded
and the fused kernels, the all-to-all dispatcher and the shared-expert overlap off (they need
CUDA streams or Transformer Engine and hold no parameters), and reports its parameters; for that
build ``torch.cuda.current_device`` answers ``"meta"``, where the layers put the buffers they
make on the GPU; for multi-head latent attention, whose local spec passes its kernel
(``DotProductAttention``, no parameters) a ``k_channels`` it does not take in megatron-core
0.19.2, a parameterless stand-in is that kernel; and ``layernorm_zero_centered_gamma``
(``--apply-layernorm-1p``), which torch's norms in the local spec refuse, is turned off for the
build (Transformer Engine's norms hold the same weights; the result reports what Megatron set).
The spec and ``GPTModel`` get ``qk_l2_norm`` and ``rotary_percent`` as Megatron-LM's
``megatron/training/models/gpt.py`` passes them; the result counts the L2 norms and the rotary width.

What is patched, and only that (``_patch``): GPU and Transformer Engine detection.
``torch.cuda.get_device_capability`` and ``torch.cuda.get_device_properties`` answer with the
case's GPU (``device``: name, major, minor), which ``validate_args`` asks about grouped GEMM,
FSDP streams and ``CUDA_DEVICE_MAX_CONNECTIONS``; ``megatron.core.utils.get_te_version``
answers ``TE_VERSION`` (Transformer Engine cannot install here), which its fp8/fp4 checks ask.
One shim for Python 3.11, which megatron-core 0.19 does not claim (it needs 3.12, whose CPU
torch is not on this machine): ``typing.override`` is typing_extensions' (a no-op decorator that
two modules import from ``typing``). No Megatron function is replaced.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
import types

MARK = "ntp-megatron-result "  # Megatron prints to stdout too: result lines carry this prefix
TE_VERSION = "2.10.0"  # what get_te_version answers: the Transformer Engine of NGC's 25.11 PyTorch
# the argparse fields a result reports (the plan's parallelism and the model's shape and settings)
FIELDS = (
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
    "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size", "data_parallel_size",
    "sequence_parallel", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "kv_channels", "seq_length", "micro_batch_size", "global_batch_size", "num_experts", "moe_router_topk",
    "rotary_base", "use_rope_scaling", "layernorm_epsilon", "add_qkv_bias", "add_bias_linear", "swiglu",
    "untie_embeddings_and_output_weights", "moe_aux_loss_coeff", "bf16", "fp16", "fp8", "fp8_recipe",
    "use_distributed_optimizer", "use_megatron_fsdp", "data_parallel_sharding_strategy", "ckpt_format",
    "quick_geglu", "overlap_p2p_comm", "multi_latent_attention", "mtp_num_layers", "recompute_granularity",
    "pipeline_model_parallel_layout", "qk_layernorm", "squared_relu", "glu_linear_offset",
    "activation_func_clamp_value", "qk_l2_norm", "layernorm_zero_centered_gamma", "rotary_percent", "no_rope_freq",
    "position_embedding_type", "rope_type",
)  # fmt: skip


def _patch(device: dict) -> None:
    """GPU and Transformer Engine detection answer for the case's GPU (the module docstring)."""
    import megatron.core.utils as core_utils
    import torch
    from packaging.version import Version

    props = types.SimpleNamespace(**device)
    torch.cuda.get_device_capability = lambda *a, **k: (props.major, props.minor)
    torch.cuda.get_device_properties = lambda *a, **k: props
    core_utils.get_te_version = lambda: Version(TE_VERSION)


def _parse(case: dict):
    """parse_args + validate_args as pretrain_gpt.py runs them, in the launch script's environment."""
    from megatron.training.arguments import parse_args, validate_args

    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(case["env"], WORLD_SIZE=str(case["world_size"]), RANK="0")
    sys.argv = ["pretrain_gpt.py", *case["args"]]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parse_args()
    except SystemExit as exc:  # argparse: an unknown flag or a bad value
        raise ValueError(f"argparse: {err.getvalue().strip().splitlines()[-1]}") from exc
    validate_args(args)
    return args


def _kernel_class():
    import torch

    class Kernel(torch.nn.Module):
        """Attention's kernel, which holds no parameters, for MLA layers (see ``_built_params``)."""

        def __init__(self, **kwargs):
            super().__init__()

    return Kernel


def _free_port() -> int:
    """A TCP port no one listens on now (another run of the loaders, or of the suite, may hold any fixed one)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _built_params(args) -> dict:
    """The model Megatron builds from ``args``, on the meta device at TP = PP = 1: its parameters."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
    from megatron.training.arguments import core_transformer_config_from_args

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
    whole = dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
                 expert_model_parallel_size=1, expert_tensor_parallel_size=1, sequence_parallel=False,
                 virtual_pipeline_model_parallel_size=None, pipeline_model_parallel_layout=None,
                 decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None,
                 use_cpu_initialization=True, perform_initialization=False, moe_grouped_gemm=False,
                 fp8=None, fp8_param_gather=False, overlap_moe_expert_parallel_comm=False, transformer_impl="local",
                 apply_rope_fusion=False, masked_softmax_fusion=False, bias_gelu_fusion=False,
                 bias_swiglu_fusion=False, bias_dropout_fusion=False, gradient_accumulation_fusion=False,
                 cross_entropy_loss_fusion=False, no_persist_layer_norm=True, moe_token_dispatcher_type="allgather",
                 moe_shared_expert_overlap=False)  # fmt: skip
    for key, value in whole.items():
        setattr(args, key, value)
    config = core_transformer_config_from_args(args)
    zero_centered = config.layernorm_zero_centered_gamma
    config.layernorm_zero_centered_gamma = False  # torch's norms refuse it; TE's hold the same weights
    spec = get_gpt_decoder_block_spec(  # as megatron/training/models/gpt.py's default_layer_spec asks
        config, use_transformer_engine=False, normalization=args.normalization, qk_l2_norm=args.qk_l2_norm
    )
    _Kernel = _kernel_class()
    if args.multi_latent_attention:  # the local spec's kernel takes no k_channels (megatron-core 0.19.2)
        for layer in spec.layer_specs:
            layer.submodules.self_attention.submodules.core_attention = _Kernel
    mtp = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False) if args.mtp_num_layers else None
    torch.cuda.current_device = lambda: "meta"  # where megatron-core puts buffers it makes on the GPU
    with torch.device("meta"):
        model = GPTModel(
            config=config, transformer_layer_spec=spec, vocab_size=args.vocab_size,
            max_sequence_length=args.max_position_embeddings, position_embedding_type=args.position_embedding_type,
            share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
            rotary_base=args.rotary_base, rope_scaling=args.use_rope_scaling, mtp_block_spec=mtp,
            rotary_percent=args.rotary_percent,
        )  # fmt: skip
    rotary = getattr(model, "rotary_pos_emb", None)
    return {
        "yarn": _yarn(model),
        "params_total": sum(p.numel() for p in model.parameters()),
        "l2_norms": sum(type(mod).__name__ == "L2Norm" for mod in model.modules()),
        "rotary_dim": 2 * rotary.inv_freq.numel() if rotary is not None else 0,
        "zero_centered_gamma": zero_centered,
        "nope_layers": sum(config.no_rope_freq or []),  # layers the attention runs without rotary (1 = skip)
        "activation": getattr(config.activation_func, "__name__", str(config.activation_func)),
        "gated_linear_unit": config.gated_linear_unit,
        "glu_linear_offset": config.glu_linear_offset,
        "activation_func_clamp_value": config.activation_func_clamp_value,
    }


def _yarn(model) -> dict | None:
    """The YaRN rotary embedding megatron-core built (GPTModel's, or MLA's inside each attention):
    its settings and the attention scale it applies (its concentration factor); None without one."""
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import _yarn_get_concentration_factor

    found = next((mod for mod in model.modules() if type(mod).__name__ == "YarnRotaryEmbedding"), None)
    if found is None:
        return None
    keys = ("scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
            "correction_range_round_to_int")  # fmt: skip
    scale = _yarn_get_concentration_factor(found.scaling_factor, found.mscale, found.mscale_all_dim)
    return {k: getattr(found, k) for k in keys} | {"attention_scale": scale}


def main(cases_file: str) -> None:
    import typing

    import typing_extensions

    if not hasattr(typing, "override"):
        typing.override = typing_extensions.override
    for case in json.loads(open(cases_file).read()):
        try:
            _patch(case["device"])
            args = _parse(case)
            result = {"name": case["name"], "ok": True, "fields": {k: getattr(args, k, None) for k in FIELDS}}
            if case.get("build"):
                result["built"] = _built_params(args)
        except Exception as exc:  # the loader's verdict, reported to the test
            lines = traceback.format_exception(exc)
            result = {"name": case["name"], "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                      "where": "".join(lines[-6:])[-3000:]}  # fmt: skip
        print(MARK + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
