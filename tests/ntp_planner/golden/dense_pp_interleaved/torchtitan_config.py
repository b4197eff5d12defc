"""torchtitan 0.3.0 job config from ntp-planner plan bd5b0db8c59e: llama3-8b, tp4 pp4(7/9/9/7) dp4 mb1 vpp2 sp rc-selective distopt.

Run launch_torchtitan.sh on each of the 8 hosts, or, with this folder on PYTHONPATH:
    torchrun --nproc_per_node 8 ... -m torchtitan.train --module torchtitan_config --config ntp_plan
Optimizer, learning-rate schedule, dataset and tokenizer path are those of torchtitan's llama3_8b
recipe; training.steps is a placeholder. Pipeline part c runs on pipeline rank c % pp (2 per rank).
"""

from torchtitan.distributed.activation_checkpoint import SelectiveAC
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_8b


def ntp_plan():
    """torchtitan's llama3_8b recipe with the plan's parallelism, batch sizes and precision."""
    config = llama3_8b()
    config.model_spec = model_registry('8B')
    config.activation_checkpoint = SelectiveAC.Config()
    config.parallelism.data_parallel_replicate_degree = 1
    config.parallelism.data_parallel_shard_degree = 4
    config.parallelism.fsdp_reshard_after_forward = 'never'
    config.parallelism.tensor_parallel_degree = 4
    config.parallelism.enable_sequence_parallel = True
    config.parallelism.context_parallel_degree = 1
    config.parallelism.pipeline_parallel_degree = 4
    config.parallelism.expert_parallel_degree = 1
    config.parallelism.pipeline_parallel_schedule = 'Interleaved1F1B'
    config.parallelism.module_fqns_per_model_part = [
        ['tok_embeddings', 'layers.0', 'layers.1', 'layers.2', 'layers.3'],
        ['layers.4', 'layers.5', 'layers.6', 'layers.7', 'layers.8'],
        ['layers.9', 'layers.10', 'layers.11', 'layers.12', 'layers.13'],
        ['layers.14', 'layers.15', 'layers.16', 'layers.17'],
        ['layers.18', 'layers.19', 'layers.20'],
        ['layers.21', 'layers.22', 'layers.23', 'layers.24'],
        ['layers.25', 'layers.26', 'layers.27', 'layers.28'],
        ['layers.29', 'layers.30', 'layers.31', 'norm', 'lm_head'],
    ]
    config.training.local_batch_size = 16
    config.training.global_batch_size = 64
    config.parallelism.pipeline_parallel_microbatch_size = 1
    config.training.seq_len = 4096
    config.training.steps = 100000
    config.training.mixed_precision_param = 'bfloat16'
    config.training.mixed_precision_reduce = 'float32'
    config.training.disable_cuda_graphs = True
    config.compile.enable = True
    config.compile.components = ['model', 'loss']
    config.compile.enable_async_tensor_parallel = False
    return config
