"""Load ntp's NeMo 2 exports with NeMo's own code, in its own environment.

Run as ``python nemo_loader.py CASES.json`` with nemo-toolkit 2.7.3 (the last release with
``nemo.collections.llm``) and its pure-Python dependencies first on PYTHONPATH (``make
test-slow`` installs them under ``.venv/nemo``; it pins transformers 4.57, the main environment
has 5), megatron-core 0.16 coming from the main environment. For each case it runs the exported
script as a user would (``python nemo2_recipe.py``: it builds ``llm.<model>.pretrain_recipe(...)``
and applies ``configure``), then builds what NeMo builds before training, without a GPU:

- the trainer's ``MegatronStrategy`` (``fdl.build``; its constructor checks the DDP/FSDP
  settings) and the ``MegatronMixedPrecision`` plugin (its constructor makes the dtype config);
- the model module and its ``TransformerConfig``, into which it copies the strategy's
  ``parallelism`` and re-runs ``__post_init__`` with NeMo's ``set_model_parallel_attributes``
  (what the strategy does when it connects the model), after the plugin's dtype settings
  (``update_config_with_dtype_overrides``, what the plugin does to the model's config);
- not the data module: its constructor fetches the GPT-2 vocabulary from the network (the
  mock data's tokenizer), so the batch sizes are read from its configuration.

It prints one JSON line per case: the parallel and batch fields NeMo ended with, or the error it
raised. What is changed, and only that: the recipes turn on Transformer Engine's fused RoPE and
MoE permutation kernels (``apply_rope_fusion``, ``moe_permute_fusion``), which megatron-core's
``TransformerConfig`` refuses without TE, a CUDA build this machine cannot install; the loader
turns those kernel choices off (``NO_TE``) after the export has run. NeMo warns that TE and Apex
are missing and falls back to its local layers.
No NeMo, fiddle or megatron-core function is replaced or stubbed.
"""

from __future__ import annotations

import json
import runpy
import sys
import traceback

MARK = "ntp-nemo-result "  # NeMo prints to stdout too: result lines carry this prefix
PARALLEL = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "sequence_parallel",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
)
NO_TE = {"apply_rope_fusion": False, "moe_permute_fusion": False}  # TE kernels the recipes ask for
CONFIG = PARALLEL + ("num_moe_experts", "moe_router_topk", "rotary_base", "fp8", "fp8_recipe", "bf16", "fp16")


def _plain(value):
    """A JSON value for a config field (dtypes and enums as their names)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def load(path: str) -> dict:
    """Run the export, build NeMo's objects from the recipe, and report what they hold."""
    import fiddle as fdl
    from nemo.lightning._strategy_lib import set_model_parallel_attributes
    from nemo.lightning.pytorch.plugins.mixed_precision import update_config_with_dtype_overrides

    recipe = runpy.run_path(path, run_name="__main__")["recipe"]
    for key, value in NO_TE.items():
        setattr(recipe.model.config, key, value)
    strategy = fdl.build(recipe.trainer.strategy)
    plugin = fdl.build(recipe.trainer.plugins)
    model = fdl.build(recipe.model)
    update_config_with_dtype_overrides(plugin.dtype_config, model.config)
    config = set_model_parallel_attributes(model, strategy.parallelism)
    data = recipe.data  # a fiddle Config: its arguments, not built (see the module's docstring)
    ddp = strategy.ddp_config
    return {
        "config": {k: _plain(getattr(config, k, None)) for k in CONFIG},
        "strategy": {k: _plain(getattr(strategy, k)) for k in PARALLEL},
        "fsdp": _plain(getattr(strategy, "_fsdp", None)),
        "ddp": {k: _plain(v) for k, v in vars(ddp).items()} if ddp is not None and not isinstance(ddp, str) else ddp,
        "data": {k: getattr(data, k) for k in ("micro_batch_size", "global_batch_size", "seq_length")},
        "nodes": recipe.trainer.num_nodes,
        "devices": recipe.trainer.devices,
    }


def main(cases_path: str) -> None:
    for case in json.loads(open(cases_path).read()):
        try:
            result = {"name": case["name"], "ok": True, **load(case["path"])}
        except Exception as error:  # noqa: BLE001 - NeMo's refusal is the result
            result = {"name": case["name"], "ok": False, "error": f"{type(error).__name__}: {error}",
                      "trace": traceback.format_exc()[-2000:]}  # fmt: skip
        print(MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
