"""The torch.distributed executor: runs a Plan's sharding for real and proves it exact.

Data flow: ``shrink`` (Plan [+ re-plan] -> ``spec.RunSpec``, no torch) -> ``launch`` (one process
per rank, watchdog) -> ``runtime.run_rank`` (per rank: ``comm`` groups, ``stage`` blocks,
``schedule`` 1F1B, ``sync`` gradients) -> compared with ``runtime.reference_run``.
``sharding``/``shards`` hold the head-aligned uneven split and its one-process check. torch is
imported only by the modules that need it, and nothing at ntp_planner start-up imports them.
"""
