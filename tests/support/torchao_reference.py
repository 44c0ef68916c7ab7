"""torchao's NVFP4 and MXFP4 round trips, the independent reference for kvviz.quant.fp4.

torchao is installed apart from kvviz's environment (requirements-reference.txt says why); this module puts that
folder on ``sys.path`` and imports it, or skips the calling test where it is missing (a machine set up by hand).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

FOLDER = Path(__file__).resolve().parents[2] / ".venv" / "reference"


def _torchao():
    if str(FOLDER) not in sys.path:
        sys.path.append(str(FOLDER))
    logging.getLogger("torchao").setLevel(logging.ERROR)  # its CUDA-only kernels say they cannot load, on a CPU
    try:
        from torchao.prototype.mx_formats.mx_tensor import MXTensor
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale
    except ImportError:
        pytest.skip("torchao (requirements-reference.txt) is not installed: run scripts/setup.sh")
    return MXTensor, NVFP4Tensor, per_tensor_amax_to_scale


def nvfp4(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``(rows, D)`` float32 through torchao's NVFP4 with a per-tensor scale from the amax of all of ``x``."""
    _, tensor, to_scale = _torchao()
    return tensor.to_nvfp4(x.contiguous(), per_tensor_scale=to_scale(x.abs().amax())).dequantize(torch.float32)


def mxfp4(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """``x`` ``(rows, D)`` float32 through torchao's MXFP4 (E2M1 elements, E8M0 scales, blocks of ``block``)."""
    mx, _, _ = _torchao()
    return mx.to_mx(x.contiguous(), torch.float4_e2m1fn_x2, block).dequantize(torch.float32)
