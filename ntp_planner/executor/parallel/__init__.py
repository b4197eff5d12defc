"""One module per parallel dimension, its collectives beside it: tensor (``tensor``, ``ownership``),
pipeline (``pipeline``, ``interleave``), data (``data``, ``reshard``), ZeRO / FSDP (``zero``,
``fsdp``); ``comm`` holds the process groups."""
