"""The MLP activations every block of the model uses: SwiGLU (dense MLPs and experts alike) and
the 2-matrix ones (GPT's GELU, Nemotron's squared ReLU)."""

from __future__ import annotations

import torch.nn.functional as F


def swiglu(x, gate_w, up_w, down_w):
    """SiLU(x W_gate^T) * (x W_up^T), then W_down^T (Shazeer 2020, "GLU Variants Improve Transformer")."""
    return (F.silu(x @ gate_w.T) * (x @ up_w.T)) @ down_w.T


ACTIVATIONS = {"gelu": F.gelu, "relu2": lambda x: F.relu(x).square()}
