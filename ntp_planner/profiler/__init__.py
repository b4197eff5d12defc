"""``ntp profile``: measure, with torch, on the device it runs on, what the cost model predicts.

``blocks`` runs the executor's own layer code (embedding, transformer layer, LM head with loss)
at the shard shape of TP rank 0 with communication replaced by local no-ops (``local_comm``);
``kernels`` measures GEMM throughput, fused attention and memory-bound passes; ``collectives``
times every collective on real process groups and ``fit`` turns the times into the alpha-beta
terms of ``cost_models.collectives``; ``machine`` puts it all in one ``Profile`` and
``local_cluster`` writes the cluster file of the machine it ran on. ``timing`` is the one timer
all of them use. Everything but ``fit`` and ``local_cluster`` imports torch; the planning
commands import none of this package.
"""
