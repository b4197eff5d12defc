"""Checkpoints as ``torch.distributed.checkpoint`` (DCP) checkpoints of NTP's uneven rows.

NTP holds uneven, head-aligned rows of each parameter, and an uneven split replicates a cut KV
head on two ranks. Each rank writes the rows it speaks for (it is their first holder in rank
order, ``speaks``: every row is written once, so no two DCP chunks overlap) as chunks of the
global tensors, and a loader reads, for each rank of any layout (another TP degree, uneven NTP,
another PP split), the rows it holds from whichever saved chunks contain them.

Layout on disk, one directory per step::

    DIR/step-00000040/rank-00003/__0_0.distcp  rank 3's chunks (``dcp.save``, no process group)
    DIR/step-00000040/rank-00003/.metadata     rank 3's own DCP metadata (its chunks only)
    DIR/step-00000040/.metadata                all ranks' metadata merged by rank 0 (``finish``)
    DIR/step-00000040/manifest.json            written last by rank 0: the step is complete

The step folder is a plain DCP checkpoint: ``dcp.load({"param": {name: tensor}, ...},
checkpoint_id=DIR/step-00000040)`` fills full-size tensors, and
``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` converts it to one torch.save
file of ``{"param" | "exp_avg" | "exp_avg_sq" | "step": {name: tensor}, "train": {"step",
"consumed_samples", "model"}}`` (``step`` under a name is AdamW's; ``train.step`` is the last
training step). Only the last ``KEEP`` complete checkpoints are kept; older directories go once a
newer one is complete.
"""

from ntp_planner.executor.checkpoint.files import (
    FORMAT,
    KEEP,
    MANIFEST,
    METADATA,
    complete_steps,
    finish,
    info,
    latest,
    load,
    rank_chunks,
    rank_dir,
    read_rows,
    save,
    speaks,
    step_dir,
)

__all__ = [
    "FORMAT",
    "KEEP",
    "MANIFEST",
    "METADATA",
    "complete_steps",
    "finish",
    "info",
    "latest",
    "load",
    "rank_chunks",
    "rank_dir",
    "read_rows",
    "save",
    "speaks",
    "step_dir",
]
