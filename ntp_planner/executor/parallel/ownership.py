"""Which attention heads, KV heads, FFN columns and vocabulary rows each TP rank owns.

Sharding is head-aligned and may be uneven (NTP: 32 heads on 30 GPUs gives two GPUs 2 heads).
Units are dealt contiguously, fuller ranks first (cost_models.degraded.uneven_shares). Under
grouped-query attention a rank needs the KV heads of all its query heads; when an uneven split
cuts a KV group, that KV head is replicated on both ranks and its weight gradients must be
summed over them.

Worked example: 8 query heads, 2 KV heads (groups of 4), degree 3: query heads
[0, 1, 2] [3, 4, 5] [6, 7]; KV heads [0] [0, 1] [1]: KV head 0 lives on ranks 0 and 1.

>>> s = layer_shards(heads=8, kv_heads=2, ffn=10, degree=3)
>>> s.heads, s.kv_heads, s.ffn
(((0, 1, 2), (3, 4, 5), (6, 7)), ((0,), (0, 1), (1,)), ((0, 4), (4, 7), (7, 10)))
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.degraded import uneven_shares


def contiguous(units: int, degree: int) -> tuple[tuple[int, int], ...]:
    """[start, end) of each rank's block of ``units``, fuller ranks first."""
    out, start = [], 0
    for n in uneven_shares(units, degree):
        out.append((start, start + n))
        start += n
    return tuple(out)


@dataclass(frozen=True)
class LayerShards:
    degree: int
    heads: tuple[tuple[int, ...], ...]  # query heads per rank
    kv_heads: tuple[tuple[int, ...], ...]  # KV heads per rank (a cut group is replicated)
    ffn: tuple[tuple[int, int], ...]  # FFN columns [start, end) per rank

    def kv_owners(self, kv: int) -> tuple[int, ...]:
        """Ranks holding KV head ``kv``: they sum its gradients."""
        return tuple(r for r, owned in enumerate(self.kv_heads) if kv in owned)


def layer_shards(heads: int, kv_heads: int, ffn: int, degree: int) -> LayerShards:
    if not 1 <= degree <= min(heads, ffn):
        raise ValueError(f"degree {degree} must be between 1 and the heads ({heads}) and FFN width ({ffn})")
    group = heads // kv_heads
    q = tuple(tuple(range(a, b)) for a, b in contiguous(heads, degree))
    kv = tuple(tuple(sorted({h // group for h in owned})) for owned in q)
    return LayerShards(degree, q, kv, contiguous(ffn, degree))


def vocab_shards(vocab: int, degree: int) -> tuple[tuple[int, int], ...]:
    """Vocabulary rows [start, end) per rank, for the embedding and the LM head."""
    return contiguous(vocab, degree)
