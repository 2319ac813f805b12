"""The builder's words for what an op is (twin.ir.OpTag), and the pass an op is written in.

Consumers that must know what an op does read its tag, never its name:
the search's bounds group a layer's compute by (micro-batch, chunk, pass,
layer), the executor's numerics binds the linears' GEMMs and collectives to
real tensors by (block, role). The words:

- blocks: the linears LINEAR_BLOCKS; the modules of a layer "ln1", "ln2",
  "attn" (the attention core), "gelu" (a Llama layer: "swiglu", and "rope_q",
  "rope_k"), "resid1", "resid2"; outside the
  layers "ln_f", "embed", "loss", "p2p" (pipeline transfers), and in the
  step around the micro-batches "main_grad", "layer" (a layer's gradient
  bucket), "optimizer".
- a linear's roles: "gemm" (forward; with tpo its chunks under a collective
  also "gemm_tail" or "gemm_rest", and "dI_tail"; recompute=op's rerun of some
  of its output columns "gemm_part"), "dI", "dW", "bias" and "dbias" (when
  its bias is added outside the GEMM), its weight's all-gather "ag_z" or
  "ag_zdata" (ZeRO-3) and the gradient's reduce-scatter "rs_z" or
  "rs_zdata", the output's or dI's all-reduce "ar_x" / "ar_y", sequence
  parallelism's "ag_x", "ag_in_x", "rs_x" (SEQUENCE_ROLES), and under fp8
  the quantisations of its input and output gradient "fp8_in", "fp8_grad",
  and, for one that sequence parallelism gathers, its amax's all-reduce
  "amax_x".
- a module's roles: its kernels, "fwd" for the module's own forward kernel
  (ln1, gelu, the flash kernel), "bwd" for its backward, and the others by
  what they do ("q_copy", "scores", "softmax_bwd", "bwd_params_sum",
  "grad_add", ...; the embedding's "word", "pos", "token", ...; the loss's
  "cast", "max", "ar_x", ...; the pipeline's "send_act", "recv_grad", ...).
- accumulations into main_grad: ACCUMULATE_ROLES, in the backward pass of
  the parameter's block and layer.
- the step's: "zero" and "scale" of main_grad (and under axonn "ar_z", the
  all-reduce over Z of the gradients it leaves whole), a gradient bucket's
  "ar_data", "rs_data", "ag_data", the tied embedding's "ar_tied", the
  optimizer's passes by name ("grad_norm", "adam", ..., and under fp8 the
  weights' quantisation "fp8_weights").

Names keep the text they always had (e.g. mb3.c1.bwd.L12.mlp_up.dW), written
here beside the tag: a label for traces and figures, read by nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from twin.ir import OpTag
from twin.quick_init import positional

LINEAR_BLOCKS = ("qkv", "attn_out", "mlp_up", "mlp_down", "lm_head")
SEQUENCE_ROLES = ("ag_x", "ag_in_x", "rs_x")  # sequence parallelism's activation collectives (weights: z, z+data)
# main_grad.add_(grad) of a parameter tensor: its size follows the parameters' sharding (gz, ZeRO-3's gdata), which
# the search's screening bound, built on the tensor-parallel grid alone, does not see (twin.search.screen), so the
# layer passes twin.search.passes groups leave them out.
ACCUMULATE_ROLES = ("acc_weight", "acc_bias", "acc_word", "acc_pos")


@dataclass(frozen=True)
class Pass:
    """Where the builder is writing: a pass of one micro-batch (and chunk), or the step around them.

    It makes each op's tag, and the start of its name: `micro_label` is
    mb<i>[.c<j>] (empty for the step), `label` adds the pass (mb3.bwd).
    Both, and `tag`, are made once per pass: the builder writes every op
    through one, and a search builds thousands of schedules.
    """

    phase: str
    micro_batch: int | None = None
    chunk: int | None = None
    micro_label: str = field(init=False, repr=False, compare=False)
    label: str = field(init=False, repr=False, compare=False)
    # tag(block, role, layer=None): the tag of an op of this pass (a partial of a cached constructor)
    tag: Callable[..., OpTag] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        micro = "" if self.micro_batch is None else f"mb{self.micro_batch}"
        if self.chunk is not None:
            micro += f".c{self.chunk}"
        object.__setattr__(self, "micro_label", micro)
        object.__setattr__(self, "label", f"{micro}.{self.phase}")
        object.__setattr__(self, "tag", partial(_tag, self.micro_batch, self.chunk, self.phase))

    def to(self, phase: str) -> Pass:
        """The same micro-batch's `phase` pass."""
        return Pass(phase, self.micro_batch, self.chunk)


new_tag = positional(OpTag)  # (micro_batch, chunk, phase, layer, block, role): a step holds a tag per op


def _tag(micro_batch: int | None, chunk: int | None, phase: str, block: str, role: str,
         layer: int | None = None) -> OpTag:
    return new_tag(micro_batch, chunk, phase, layer, block, role)


STEP = Pass("step")
