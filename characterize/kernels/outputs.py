"""Kernels stage, outputs: what one embedding-bag forward returns, whoever's kernel ran it
(ours through kernels.library, FBGEMM's through kernels.fbgemm)."""

from __future__ import annotations

from typing import NamedTuple

import torch


class BagOutputs(NamedTuple):
    output: torch.Tensor      # [B, D], pooled in fp32
    offset2bag: torch.Tensor  # [N] (empty where the kernel does not write it: torch, FBGEMM)
    bag_size: torch.Tensor    # [B] (empty likewise)
