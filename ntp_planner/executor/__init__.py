"""The torch.distributed executor: runs a Plan's sharding for real and proves it exact.

Data flow: ``shrink`` (Plan [+ re-plan] -> ``spec.RunSpec``, no torch) -> ``launch`` (one process
per rank and a watchdog, or one rank under torchrun) -> ``runtime.run_rank`` (per rank: ``comm``
groups and collectives, ``stage`` blocks, ``schedule`` 1F1B (interleaved in ``interleave``'s order
with vpp > 1), ``sync`` gradients with ``reshard`` for NTP, or ``optimizer`` for ZeRO-1/2/3
(``fsdp``: per-micro-batch gathers and reduce-scatters) and bf16 master weights) -> compared with
``runtime.reference_run`` (``model``, one process).
``relayout`` (no torch) lays a running job out again when processes die or come back: which
live process runs which rank, at what width and batch, under the run's failure policy.
``ownership`` says which heads, FFN columns and vocabulary rows a rank holds and ``tp_slices`` checks
the split in one process. torch is imported only by the modules that need it, and nothing at
ntp_planner start-up imports them.
"""
