"""NeMo 2.0 recipe settings from ntp-planner plan 7d0e84916ee7: deepseek-v3, tp2 pp8 dp16 ep16 etp1 moe-flex a2a-1f1b mb1 vpp2 sp distopt.

For NeMo 2.x (nemo-toolkit 2.0 to 2.7, which have nemo.collections.llm); NeMo 3: --format bridge.
"""

import torch
from nemo.collections import llm


def configure(recipe):
    """Apply the plan's parallelism and batch sizes to a NeMo 2.0 pretraining recipe."""
    recipe.trainer.num_nodes = 32
    recipe.trainer.devices = 8
    strategy = recipe.trainer.strategy
    strategy.tensor_model_parallel_size = 2
    strategy.pipeline_model_parallel_size = 8
    strategy.virtual_pipeline_model_parallel_size = 2
    strategy.context_parallel_size = 1
    strategy.sequence_parallel = True
    strategy.expert_model_parallel_size = 16
    strategy.expert_tensor_parallel_size = 1
    strategy.num_layers_in_first_pipeline_stage = None
    strategy.num_layers_in_last_pipeline_stage = None
    recipe.model.config.pipeline_model_parallel_layout = 'Etttt|tttt|tttt|tttt|tttt|tttt|tttt|tttt|tttt|tttt|tttt|tttt|tttt|ttt|ttt|tttmL'
    recipe.model.config.num_moe_experts = 256
    recipe.model.config.moe_router_topk = 8
    recipe.model.config.moe_ffn_hidden_size = 2048
    recipe.model.config.moe_grouped_gemm = True
    recipe.model.config.moe_token_dispatcher_type = 'flex'
    recipe.model.config.moe_flex_dispatcher_backend = 'deepep'
    recipe.model.config.overlap_moe_expert_parallel_comm = True
    recipe.model.config.moe_layer_freq = [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    recipe.model.config.moe_shared_expert_intermediate_size = 2048
    recipe.model.config.moe_shared_expert_overlap = False
    recipe.model.config.multi_latent_attention = True
    recipe.model.config.q_lora_rank = 1536
    recipe.model.config.kv_lora_rank = 512
    recipe.model.config.qk_head_dim = 128
    recipe.model.config.qk_pos_emb_head_dim = 64
    recipe.model.config.v_head_dim = 128
    recipe.model.config.mtp_num_layers = 1
    recipe.model.config.qk_layernorm = True
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
    recipe.model.config.expert_tensor_parallel_size = strategy.expert_tensor_parallel_size
    recipe.model.config.num_layers_in_first_pipeline_stage = strategy.num_layers_in_first_pipeline_stage
    recipe.model.config.num_layers_in_last_pipeline_stage = strategy.num_layers_in_last_pipeline_stage
    recipe.model.config.pipeline_dtype = strategy.pipeline_dtype
    recipe.data.micro_batch_size = 1
    recipe.data.global_batch_size = 256
    recipe.data.seq_length = 4096
    return recipe


if __name__ == "__main__":
    recipe = llm.deepseek_v3.pretrain_recipe(num_nodes=32, num_gpus_per_node=8)
    if recipe is not None:
        configure(recipe)
