"""Bad model, training and layout input ends in one sentence naming the key or field at fault:
InputError (or pydantic's ValidationError), never a traceback, a hang or a silent truncation."""

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cost_models import MODELS, ModelSpec, ParallelLayout, TrainingSpec, resolve_model
from cost_models.hf_config import load_model_file, model_from_hf_config
from topologies import InputError
from topologies.cluster_catalogue import first_error

LLAMA_CFG = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "hidden_act": "silu",
    "rope_theta": 500000.0,
}


def sentence(exc: BaseException) -> str:
    """The one line a user sees; fails the test if there is more than one."""
    text = first_error(exc) if isinstance(exc, ValidationError) else str(exc)
    assert text and "\n" not in text, text
    return text


# ---- HuggingFace configs ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("num_attention_heads", None, "num_attention_heads is null; it must be a whole number"),
        ("num_attention_heads", [32], "num_attention_heads is [32]; it must be a whole number"),
        ("num_attention_heads", 0, "num_attention_heads: Input should be greater than 0"),
        ("num_attention_heads", 10**6, "num_attention_heads: must lie in 1..65,536 heads, not 1,000,000"),
        ("num_attention_heads", math.inf, "num_attention_heads is inf; it must be a whole number"),
        ("num_attention_heads", True, "num_attention_heads is true"),
        ("num_attention_heads", 2.5, "num_attention_heads is 2.5"),
        ("num_key_value_heads", 7, "num_attention_heads (32) must be a multiple of num_key_value_heads (7)"),
        ("num_hidden_layers", 10**30, "num_hidden_layers: must lie in 1..10,000 layers, not 1e+30"),
        ("num_hidden_layers", 10**4000, "num_hidden_layers: must lie in 1..10,000 layers, not about 1e+"),
        ("num_hidden_layers", -3, "num_hidden_layers: Input should be greater than 0"),
        ("hidden_size", 16, "head_dim (hidden_size // num_attention_heads): Input should be greater than 0"),
        ("hidden_size", 10**9, "hidden_size: must lie in 1..4,194,304 elements"),
        ("intermediate_size", "big", "intermediate_size is 'big'"),
        ("vocab_size", {"a": 1}, "vocab_size is {'a': 1}"),
        ("max_position_embeddings", None, "max_position_embeddings is null"),
        ("attention_dropout", "0.1x", "attention_dropout is '0.1x'; it must be a number"),
        ("attention_dropout", math.nan, "attention_dropout is nan; it must be a finite number"),
        ("attention_dropout", 1.5, "attention_dropout: Input should be less than 1"),
        ("text_config", [1, 2], "text_config is [1, 2]; it must be a mapping"),
        ("num_local_experts", 8.0, None),  # a whole float is a whole number
        ("num_local_experts", 10**7, "num_local_experts: must lie in 0..65,536 experts"),
        ("num_experts_per_tok", 0, None),  # only read for MoE models
    ],
)
def test_bad_hf_values(key, value, message):
    cfg = {**LLAMA_CFG, key: value}
    if message is None:
        model_from_hf_config(cfg, "x", where="cfg.json")
        return
    with pytest.raises(InputError) as err:
        model_from_hf_config(cfg, "x", where="cfg.json")
    assert sentence(err.value).startswith("cfg.json: ") and message in str(err.value)


MOE_CFG = {**LLAMA_CFG, "n_routed_experts": 64, "moe_intermediate_size": 1408, "num_experts_per_tok": 6}


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        # written 0 or false is read as written, never taken for "absent"
        ({"num_key_value_heads": 0}, "cfg.json: num_key_value_heads: Input should be greater than 0"),
        ({"num_key_value_heads": False}, "num_key_value_heads is false (a boolean); it must be a whole number"),
        ({"head_dim": 0}, "cfg.json: head_dim: Input should be greater than 0"),
        (
            {"decoder_sparse_step": 0, **MOE_CFG},
            "cfg.json: decoder_sparse_step: Input should be greater than or equal to 1",
        ),
        ({**MOE_CFG, "moe_intermediate_size": 0}, "moe_intermediate_size is 0 but the model has 64 experts"),
        # strings and booleans are refused where numbers or booleans belong, not converted
        ({"hidden_size": "4096"}, "hidden_size is '4096' (a string); it must be a whole number"),
        ({"num_hidden_layers": True}, "num_hidden_layers is true (a boolean); it must be a whole number"),
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings is 'false'; it must be true or false (unquoted)"),
        ({"tie_word_embeddings": 0}, "tie_word_embeddings is 0; it must be true or false"),
        ({"attention_bias": "no"}, "attention_bias is 'no'; it must be true or false"),
        ({"attention_dropout": False}, "attention_dropout is false; it must be a number"),
        ({"hidden_act": 5}, "hidden_act is 5; it must be an activation name"),
        # contradictory MoE settings
        ({**MOE_CFG, "first_k_dense_replace": 32}, "first_k_dense_replace 32 >= num_hidden_layers 32 leaves no MoE"),
        ({**MOE_CFG, "num_local_experts": 8}, "num_local_experts 8 and n_routed_experts 64 disagree"),
    ],
)
def test_hf_reader_tells_written_zero_from_absent_and_refuses_wrong_types(edits, message):
    with pytest.raises(InputError) as err:
        model_from_hf_config({**LLAMA_CFG, **edits}, "x", where="cfg.json")
    assert sentence(err.value).startswith("cfg.json") and message in str(err.value), str(err.value)


def test_hf_reader_defaults_only_what_is_absent_or_null():
    plain = model_from_hf_config(LLAMA_CFG, "x")
    assert (plain.num_kv_heads, plain.head_dim, plain.tie_embeddings) == (8, 128, False)
    nulls = model_from_hf_config({**LLAMA_CFG, "num_key_value_heads": None, "head_dim": None}, "x")
    assert (nulls.num_kv_heads, nulls.head_dim) == (32, 128)  # HuggingFace: null = not set
    assert model_from_hf_config({**LLAMA_CFG, "tie_word_embeddings": True}, "x").tie_embeddings
    moe = model_from_hf_config({**MOE_CFG, "first_k_dense_replace": 31, "n_shared_experts": 0}, "x")
    assert (moe.num_moe_layers, moe.moe_shared_ffn_hidden_size) == (1, 0)  # the last layer, no shared expert


def test_moe_keys_are_named_in_their_config_spelling():
    cfg = {**LLAMA_CFG, "num_local_experts": 8, "num_experts_per_tok": 9}
    with pytest.raises(InputError, match=r"num_experts_per_tok \(9\) must be in 1..num_local_experts \(8\)"):
        model_from_hf_config(cfg, "x")
    cfg = {**LLAMA_CFG, "n_routed_experts": 8, "moe_intermediate_size": 1024, "num_experts_per_tok": 0}
    with pytest.raises(InputError, match=r"cfg: num_experts_per_tok \(0\) must be in 1..n_routed_experts \(8\)"):
        model_from_hf_config(cfg, "x", where="cfg")
    cfg = {**LLAMA_CFG, "num_attention_heads": 31}
    with pytest.raises(InputError, match=r"num_attention_heads \(31\) must be a multiple of num_key_value_heads"):
        model_from_hf_config(cfg, "x")
    cfg = {**LLAMA_CFG, "n_routed_experts": 64, "moe_intermediate_size": 10**8}
    with pytest.raises(InputError, match="cfg: moe_intermediate_size: must lie in 0..4,194,304 elements"):
        model_from_hf_config(cfg, "x", where="cfg")


CONFIG_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.lists(st.integers(min_value=0, max_value=64), max_size=3),
    st.dictionaries(st.sampled_from(["hidden_size", "num_attention_heads"]), st.integers(), max_size=2),
)
KEYS = [
    *LLAMA_CFG,
    "head_dim",
    "attention_dropout",
    "tie_word_embeddings",
    "text_config",
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "decoder_sparse_step",
    "first_k_dense_replace",
    "shared_expert_intermediate_size",
    "n_shared_experts",
]


@settings(max_examples=300, deadline=2000)
@given(edits=st.dictionaries(st.sampled_from(KEYS), CONFIG_VALUES, min_size=1, max_size=3))
def test_any_hf_config_gives_a_model_or_one_sentence(edits):
    try:
        model = model_from_hf_config({**LLAMA_CFG, **edits}, "x", where="cfg.json")
    except InputError as exc:
        assert sentence(exc).startswith("cfg.json")
        return
    assert 1 <= model.num_layers <= 10_000 and model.num_params > 0


@settings(max_examples=60, deadline=3000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(KEYS), value=CONFIG_VALUES)
def test_any_model_file_loads_or_names_itself(tmp_path, key, value):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_CFG, key: value}))
    try:
        load_model_file(path)
    except InputError as exc:
        assert str(path) in sentence(exc)


def test_model_file_in_the_current_folder_is_named_after_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CFG))
    assert resolve_model("config.json").name == tmp_path.name  # its folder, as for any config.json


def test_unknown_model_name_is_an_input_error_without_cli_words():
    with pytest.raises(InputError, match="did you mean 'llama3-8b'") as err:
        resolve_model("llama3-8")
    assert "--" not in str(err.value) and "ntp " not in str(err.value)


# ---- ModelSpec, TrainingSpec, ParallelLayout --------------------------------------------
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_layers", 10**30, "num_layers: must lie in 1..10,000 layers, not 1e+30"),
        ("hidden_size", 0, "hidden_size: Input should be greater than 0"),
        ("vocab_size", 10**9, "vocab_size: must lie in 1..16,777,216 tokens"),
        ("dropout", math.nan, "dropout: Input should be a finite number"),
        ("name", "", "name: String should have at least 1 character"),
        ("max_position_embeddings", 10**12, "max_position_embeddings: must lie in 1..1e+09 tokens"),
    ],
)
def test_bad_model_fields(field, value, message):
    with pytest.raises(ValidationError) as err:
        ModelSpec(**{**MODELS["llama3-8b"].model_dump(), field: value})
    assert message in sentence(err.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(global_batch=10**30), "global_batch: must lie in 1..10,000,000 sequences, not 1e+30"),
        (dict(global_batch=0), "global_batch: Input should be greater than 0"),
        (dict(seq_len=10**10), "seq_len: must lie in 1..1e+09 tokens, not 1e+10"),
        (dict(seq_len=-5), "seq_len: Input should be greater than 0"),
        (dict(seq_len=math.inf), "seq_len: Input should be a finite number"),
        (dict(fp8_params=True), "need an fp8 or fp4 format, not bf16; set fp8_params false or dtype to fp8"),
        (dict(dtype="fp7"), "dtype: Input should be 'fp16', 'bf16', 'fp8', 'mxfp8' or 'nvfp4'"),
        (dict(moe_flex_backend="nccl"), "moe_flex_backend: Input should be 'deepep' or 'hybridep'"),
    ],
)
def test_bad_training_fields(kwargs, message):
    with pytest.raises(ValidationError) as err:
        TrainingSpec(**kwargs)
    text = sentence(err.value)
    assert message in text and "--" not in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(tp=0), "tp: Input should be greater than or equal to 1"),
        (dict(tp=10**30), "tp: must lie in 1..1,000,000 GPUs, not 1e+30"),
        (dict(pp=1024, dp=1024, global_batch=1024), "tp(1) * cp(1) * dp(1024) * pp(1024) = 1,048,576 GPUs is more"),
        (dict(pp=128, vpp=128), "pp(128) * vpp(128) = 16,384 model chunks is more than a model can fill (10,002"),
        (dict(global_batch=10**30), "global_batch: must lie in 1..10,000,000 sequences"),
        (dict(micro_batch=3), "global_batch(8) is not divisible by micro_batch(3) * dp(1) = 3"),
        (dict(tp=8, layer_tp=(8, 3, 8)), "layer_tp: block 1 has degree 3, which does not divide the stage width"),
        (dict(tp=8, layer_tp=(8, 0, 8)), "layer_tp: block 1 has degree 0"),
        (dict(sequence_parallel=True), "sequence parallelism needs tp > 1; set sequence_parallel false or tp above 1"),
        (dict(zero=1, reshard_after_forward=False), "set reshard_after_forward true or zero 3"),
        (dict(pp=2, pp_layers=(1, 2, 3)), "pp_layers has 3 entries but pp = 2"),
        (dict(chunk_layers=tuple(range(20_000))), "chunk_layers: Tuple should have at most 10002 items"),
    ],
)
def test_bad_layout_fields(kwargs, message):
    with pytest.raises(ValidationError) as err:
        ParallelLayout(**{"global_batch": 8, **kwargs})
    text = sentence(err.value)
    assert message in text and "--" not in text


@settings(max_examples=200, deadline=2000)
@given(
    field=st.sampled_from(["tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "global_batch"]),
    value=st.one_of(st.integers(min_value=-(10**40), max_value=10**40), st.floats(allow_nan=True, allow_infinity=True)),
)
def test_any_layout_degree_is_bounded_or_refused_in_one_line(field, value):
    try:
        layout = ParallelLayout(**{"global_batch": 1, field: value})
    except ValidationError as exc:
        sentence(exc)
        return
    assert 1 <= layout.world_size <= 10**6 and layout.pp * layout.vpp <= 10_002


GPT_OSS_CFG = json.loads((Path(__file__).parent / "hf_configs" / "gpt-oss-20b.json").read_text())
GEMMA2_CFG = {**LLAMA_CFG, "model_type": "gemma2", "hidden_activation": "gelu_pytorch_tanh"}


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        # an activation transformers has no class for was read as a plain GELU MLP
        ({**LLAMA_CFG, "hidden_act": "squared_relu"}, "hidden_act is 'squared_relu', not an activation transformers"),
        ({**LLAMA_CFG, "hidden_act": "silu "}, "hidden_act is 'silu ', not an activation transformers builds"),
        ({**LLAMA_CFG, "hidden_act": ""}, "hidden_act is '', not an activation"),
        ({**GEMMA2_CFG, "hidden_activation": "geglu"}, "hidden_activation is 'geglu', not an activation"),
        # the new keys with wrong types, out of range, or meaningless where they are
        ({**GPT_OSS_CFG, "swiglu_limit": "7"}, "swiglu_limit is '7'; it must be a number"),
        ({**GPT_OSS_CFG, "swiglu_limit": True}, "swiglu_limit is true; it must be a number"),
        ({**GPT_OSS_CFG, "swiglu_limit": None}, "swiglu_limit is null; it must be a number"),
        ({**GPT_OSS_CFG, "swiglu_limit": -7}, "swiglu_limit: Input should be greater than 0"),
        ({**GPT_OSS_CFG, "swiglu_limit": float("nan")}, "swiglu_limit is nan; it must be a finite number"),
        ({**GPT_OSS_CFG, "swiglu_limit": 1e308}, "swiglu_limit: Input should be less than or equal to 1000000"),
        # a JSON integer past the largest float overflowed float() (a traceback, exit 1)
        ({**GPT_OSS_CFG, "swiglu_limit": 10**400}, "swiglu_limit is a 300+ digit number; it must be a finite number"),
        ({**LLAMA_CFG, "attention_dropout": -(10**309)}, "attention_dropout is a 300+ digit number; it must be"),
        ({**GPT_OSS_CFG, "swiglu_alpha": "1.702"}, "swiglu_alpha is '1.702'; it must be a number"),
        ({**GEMMA2_CFG, "attn_logit_softcapping": 0}, "attn_logit_softcapping: Input should be greater than 0"),
        ({**GEMMA2_CFG, "final_logit_softcapping": False}, "final_logit_softcapping is false; it must be a number"),
        ({**GEMMA2_CFG, "final_logit_softcapping": "30"}, "final_logit_softcapping is '30'; it must be a number"),
        ({**MOE_CFG, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
          "v_head_dim": 128, "num_key_value_heads": 32, "model_type": "qwen3"},
         "qk_norm normalises each query and key head; MLA"),
    ],
)  # fmt: skip
def test_hf_reader_refuses_new_keys_of_wrong_types_and_unknown_activations(cfg, message):
    with pytest.raises(InputError) as err:
        model_from_hf_config(cfg, "x", where="cfg.json")
    assert sentence(err.value).startswith("cfg.json: ") and message in str(err.value), str(err.value)


def test_gpt_oss_gates_its_mlp_whatever_hidden_act_says():
    # GptOssExperts computes its clamped, offset quick-GELU gate without reading hidden_act: a file
    # with hidden_act "gelu" was read as an ungated 2-matrix MLP carrying a gate's clamp and offset
    for act in ("silu", "gelu", "relu2"):
        m = model_from_hf_config({**GPT_OSS_CFG, "hidden_act": act}, "oss")
        assert (m.gated_mlp, m.mlp_matrices, m.gate_activation, m.activation_clamp) == (True, 3, "quick_gelu", 7.0)


def test_a_gate_clamp_or_offset_on_an_ungated_mlp_is_refused():
    plain = model_from_hf_config({**LLAMA_CFG, "hidden_act": "gelu"}, "x")
    assert not plain.gated_mlp
    for field, value in (("activation_clamp", 7.0), ("gate_linear_offset", 1.0)):
        with pytest.raises(ValidationError, match="shape a gated MLP's gate and up-projection, and this MLP is not"):
            ModelSpec.model_validate({**plain.model_dump(), field: value})
