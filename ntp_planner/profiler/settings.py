"""What one ``ntp profile`` run measures: the choices of the command, defaults filled in and
checked (InputError in one sentence), and the shapes they give. Pure data; no torch.

Defaults per device: on CUDA llama3-8b blocks at 4096 tokens in bf16, micro-batches 1, 2, 4,
messages up to 256 MB; on CPU the smallest Llama of the catalogue (llama2-7b, the executor's own
architecture) at 256 tokens in float32, micro-batches 1 and 2, messages up to 64 MB: a few
minutes on two cores. ``quick`` keeps the whole run under a minute on two cores: 64 tokens, one
micro-batch, two repetitions, messages up to 1 MB.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.model import ModelSpec
from cost_models.profile import BlockShape
from topologies.errors import InputError

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64", "half": "float16",
          "float": "float32", "double": "float64"}  # fmt: skip
TORCH_DTYPES = ("float32", "bfloat16", "float16", "float64")


def dtype_name(text: str, option: str = "dtype") -> str:
    """The torch name of a dtype spelled either way: ``bf16`` -> ``bfloat16``, ``torch.float32`` -> ``float32``;
    ``option`` is what the message calls the value (``--dtype`` on the command line)."""
    name = text.strip().lower().removeprefix("torch.")
    name = DTYPES.get(name, name)
    if name not in TORCH_DTYPES:
        raise InputError(f"{option} {text!r} is not one of {', '.join(TORCH_DTYPES)} (or bf16, fp16, fp32)")
    return name


@dataclass(frozen=True)
class ProfileSettings:
    """One profile's choices, every default filled in."""

    device: str  # "cuda" or "cpu"
    backend: str  # "nccl" or "gloo"
    nproc: int  # processes of the collectives (devices the profile stands for)
    model: ModelSpec  # whose blocks are measured
    dtype: str  # torch dtype name of blocks, GEMMs and messages
    seq_len: int  # tokens per sequence of the blocks
    micro_batches: tuple[int, ...]  # sequences per micro-batch measured
    tps: tuple[int, ...]  # TP degrees whose shard shapes are measured
    quick: bool = False
    seed: int = 0
    threads: int | None = None  # torch threads per device on CPU (cores / nproc); None on CUDA

    @property
    def reps(self) -> int:
        """Timed repetitions behind each median: a GPU's kernels are milliseconds, a CPU's seconds."""
        return 2 if self.quick else (10 if self.device == "cuda" else 3)

    @property
    def max_message_bytes(self) -> int:
        if self.quick:
            return 2**20
        return 256 * 2**20 if self.device == "cuda" else 64 * 2**20

    def block_shapes(self) -> list[BlockShape]:
        """Embedding, layer (and MoE layer where the model has one) and LM head at every TP degree."""
        m = self.model
        kinds = ["embedding", "layer"] + (["moe_layer"] if m.num_experts else []) + ["head"]
        out = []
        for tp in self.tps:
            for kind in kinds:
                moe = kind == "moe_layer"
                out.append(
                    BlockShape(
                        kind=kind,
                        hidden=m.hidden_size,
                        heads=m.num_heads,
                        kv_heads=m.num_kv_heads,
                        head_dim=m.head_dim,
                        ffn=m.moe_ffn_hidden_size if moe else m.ffn_hidden_size,
                        vocab=m.vocab_size,
                        experts=m.num_experts if moe else 0,
                        top_k=m.moe_top_k if moe else 0,
                        tp=tp,
                        seq_len=self.seq_len,
                    )  # fmt: skip
                )
        return out

    def block_requests(self) -> list[tuple[BlockShape, int]]:
        return [(s, b) for s in self.block_shapes() for b in self.micro_batches]

    def gemm_shapes(self) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
        """(square sweep, the layer's own products at the smallest micro-batch: tokens x hidden x
        hidden, tokens x FFN shard x hidden). The squares are bounded and come first: their rate
        decides whether the model's blocks are affordable at all."""
        cubes = {"cuda": (1024, 2048, 4096, 8192), "cpu": (256, 512, 1024, 2048)}[self.device]
        if self.quick:
            cubes = cubes[:3]
        t, h = self.seq_len * self.micro_batches[0], self.model.hidden_size
        model = [(t, h, h), (t, self.model.ffn_hidden_size // max(self.tps), h)]
        return [(c, c, c) for c in cubes], ([] if self.quick else model)

    def attention_shapes(self) -> list[tuple[int, int, int, int]]:
        m, mbs = self.model, self.micro_batches[:1] if self.quick else self.micro_batches
        return [(b, m.num_heads, self.seq_len, m.head_dim) for b in mbs]

    def pass_sizes(self) -> tuple[int, int, int]:
        """(tokens, hidden, AdamW parameters) of the memory-bound passes."""
        params = 2**20 if self.quick else (64 * 2**20 if self.device == "cuda" else 4 * 2**20)
        return self.seq_len * max(self.micro_batches), self.model.hidden_size, params


def check_degrees(model: ModelSpec, tps: tuple[int, ...], nproc: int) -> None:
    """InputError unless every TP degree is one the executor can shard ``model`` at on ``nproc`` devices."""
    for t in tps:
        if t > nproc:
            raise InputError(
                f"--tp {t} exceeds the {nproc} devices (processes) of this profile; lower it or raise --nproc"
            )
        if t > min(model.num_heads, model.ffn_hidden_size):
            raise InputError(f"--tp {t} exceeds {model.name}'s {model.num_heads} heads")
