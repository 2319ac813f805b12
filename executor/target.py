"""Where and in what element type a rank runs: GPU with NCCL in the IR's dtype, else CPU with gloo in float32.

Apart from executor.runtime (which runs a rank's program on the Target chosen here) because the choice is about
the host, not the program: what device torch sees, what this CPU computes natively.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Target:
    """Where and in what element type a rank runs."""

    device: torch.device
    backend: str  # of the op channels: "gloo" or "nccl"
    dtype: torch.dtype
    note: str  # why this dtype, for the output

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def _cpu_has_native_bf16() -> bool:
    """AMX-BF16 or AVX512-BF16: oneDNN runs bf16 GEMMs natively (faster than fp32) on this CPU."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def choose_target(ir_dtype: str, device: str = "auto", dtype: str = "auto", local_rank: int = 0) -> Target:
    """GPU if there is one (NCCL, the IR's dtype); else CPU (gloo) in float32.

    On CPU float32 is the default: without native bf16 (AMX-BF16 /
    AVX512-BF16) bf16 GEMMs are emulated and slow, and even with it torch's
    CPU bf16 kernels do not follow their flops (on this project's AMX host the
    bf16 SDPA backward took 7-28x its forward, float32 2.4-4.4x, for a kernel
    doing 2.5x the forward's flops; bf16 GEMM rates swung 18-920 GF/s by
    shape and layout), which no compute model fits. Byte counts of
    communication and element-wise ops stay the IR's either way (see
    executor.kernels); `--dtype bfloat16` runs bf16 anyway.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda but torch sees no GPU")
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        dev, backend = torch.device("cuda", torch.cuda.current_device()), "nccl"
    else:
        dev, backend = torch.device("cpu"), "gloo"
    if dtype != "auto":
        chosen, note = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype], "as asked (--dtype)"
    elif dev.type == "cuda":
        chosen, note = TORCH_DTYPES[ir_dtype], f"the schedule's dtype ({ir_dtype})"
    elif ir_dtype == "fp32":
        chosen, note = torch.float32, "the schedule's dtype (fp32)"
    elif not _cpu_has_native_bf16():
        chosen, note = torch.float32, f"float32 instead of the schedule's {ir_dtype}: no native {ir_dtype} matmul on this CPU"
    else:
        chosen, note = torch.float32, (f"float32 instead of the schedule's {ir_dtype}: torch's CPU bf16 kernels "
                                       "(attention backward, some GEMM layouts) do not follow their flops; "
                                       "--dtype bfloat16 runs bf16 anyway")
    return Target(dev, backend, chosen, note)
