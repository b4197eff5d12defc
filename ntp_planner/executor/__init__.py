"""The torch.distributed executor (work in progress): runs a Plan's sharding for real.

So far: the sharding description (``sharding``), a Llama-style reference decoder (``model``) and
the per-rank shard computations (``shards``), checked in one process against the reference.
torch is imported only inside ``model`` and ``shards``; nothing at ntp_planner start-up imports
this package.
"""
