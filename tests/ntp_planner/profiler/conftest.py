import json

import pytest

TINY_MODEL = {  # a HuggingFace config.json of a tiny Llama: blocks in milliseconds on a CPU
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 64,
    "max_position_embeddings": 256,
    "hidden_act": "silu",
}


@pytest.fixture
def tiny_model(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY_MODEL))
    return path
