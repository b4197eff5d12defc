"""NeMo 2.0 recipe settings from ntp-planner plan bd5b0db8c59e: llama3-8b, tp4 pp4(7/9/9/7) dp4 mb1 vpp2 sp rc-selective distopt.

For NeMo 2.x (nemo-toolkit 2.0 to 2.7, which have nemo.collections.llm); NeMo 3: --format bridge.
"""

import torch
from nemo.collections import llm


def configure(recipe):
    """Apply the plan's parallelism and batch sizes to a NeMo 2.0 pretraining recipe."""
    recipe.trainer.num_nodes = 8
    recipe.trainer.devices = 8
    strategy = recipe.trainer.strategy
    strategy.tensor_model_parallel_size = 4
    strategy.pipeline_model_parallel_size = 4
    strategy.virtual_pipeline_model_parallel_size = 2
    strategy.context_parallel_size = 1
    strategy.sequence_parallel = True
    strategy.expert_model_parallel_size = 1
    strategy.num_layers_in_first_pipeline_stage = None
    strategy.num_layers_in_last_pipeline_stage = None
    recipe.model.config.pipeline_model_parallel_layout = 'Etttt|ttttt|ttttt|tttt|ttt|tttt|tttt|tttL'
    strategy.ddp.use_distributed_optimizer = True
    strategy.ddp.overlap_grad_reduce = True
    strategy.ddp.overlap_param_gather = True
    recipe.trainer.plugins.grad_reduce_in_fp32 = True
    strategy.pipeline_dtype = torch.bfloat16
    recipe.model.config.tensor_model_parallel_size = strategy.tensor_model_parallel_size
    recipe.model.config.pipeline_model_parallel_size = strategy.pipeline_model_parallel_size
    recipe.model.config.virtual_pipeline_model_parallel_size = strategy.virtual_pipeline_model_parallel_size
    recipe.model.config.context_parallel_size = strategy.context_parallel_size
    recipe.model.config.sequence_parallel = strategy.sequence_parallel
    recipe.model.config.expert_model_parallel_size = strategy.expert_model_parallel_size
    recipe.model.config.num_layers_in_first_pipeline_stage = strategy.num_layers_in_first_pipeline_stage
    recipe.model.config.num_layers_in_last_pipeline_stage = strategy.num_layers_in_last_pipeline_stage
    recipe.model.config.pipeline_dtype = strategy.pipeline_dtype
    recipe.data.micro_batch_size = 1
    recipe.data.global_batch_size = 64
    recipe.data.seq_length = 4096
    return recipe


if __name__ == "__main__":
    recipe = llm.llama3_8b.pretrain_recipe(num_nodes=8, num_gpus_per_node=8)
    if recipe is not None:
        configure(recipe)
