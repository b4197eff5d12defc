"""The torch.distributed executor: runs a Plan's sharding for real and proves it exact.

Data flow, one package per step:

- ``shrink`` (no torch): Plan [+ re-plan] -> ``spec.RunSpec``, a run this host can afford.
- ``spec`` (no torch): replicas of stages of blocks at TP degrees, and the rank arithmetic.
- ``model``: the plain single-process decoder (``reference``), its mixture of experts, the batch.
- ``parallel``: one module per dimension with its collectives: ``tensor`` + ``ownership`` (TP
  slices, head-aligned and uneven under NTP), ``pipeline`` + ``interleave`` (1F1B), ``data`` +
  ``reshard`` (gradient sync, NTP's reshard), ``zero`` + ``fsdp`` (ZeRO-1/2/3), ``comm`` (groups).
- ``train``: one rank's ``stage``, the ``runtime`` that runs it, the ``launch``-er (spawned
  processes and a watchdog, or one rank under torchrun).
- ``check``: every holder compared with the reference (``holders``), the measurement
  (``measure``), the cuts against the planner's shares (``cuts``), the prediction (``predict``).
- ``checkpoint``: save in one layout, load in any.
- ``elastic`` (live recovery): ``faults``, the ``worker``'s generations, the ``coordinator``,
  the next layout (``relayout``, no torch) and how the state moves to it (``state``).

torch is imported only by the modules that need it, and nothing at ntp_planner start-up imports
them.
"""
