"""The element-wise kernels of a Llama layer run op by op in eager PyTorch (ParallelPlan.kernels = "eager").

torchtitan's Llama of 2024 (pytorch/torchtitan, torchtitan/models/llama/model.py
at commit 0413364, the code of its A100 performance page, with compile off as
its configs have it) launches, where Megatron-Core runs one fused kernel per
module (twin.builders.megatron_kernels):

- the rotary embedding (apply_rotary_emb) on q and on k: a cast up to fp32
  (xq.float()), the complex multiply by freqs_cis, a cast back (type_as);
  its backward the same three, in reverse (autograd of type_as, of the
  multiply by the constant freqs_cis, of the cast);
- SwiGLU (FeedForward: w2(F.silu(w1(x)) * w3(x))): silu, then the multiply;
  its backward the multiply's two products and silu's backward;
- grouped-query attention's repeat_kv: k and v expanded to every query head
  and copied (reshape of an expanded view) before SDPA, and in the backward
  the expanded gradients summed back; around the kernel only the output's
  transpose(1, 2).contiguous(), a copy, where Megatron's path rearranges q,
  k and v first (FLASH_COPIED) and concatenates their gradients after.

Its norms are not here: the configs of the page's 8B and 13B runs set
fused_rmsnorm (a Triton kernel each way), which the fused count already is.
Each kernel is counted as what it must read and write per element of its
output [estimate: from the code, not a kernel trace]: (role, bytes, flops)
per element, bf16 tensors 2 bytes and their fp32 copies 4.
"""

from __future__ import annotations

# apply_rotary_emb, per element of q or k: cast up, complex multiply (3 flops a real element: a complex product
# is 6 over two), cast down; the backward the same over the gradient.
ROPE_FORWARD = (("up", 2 + 4, 0), ("fwd", 4 + 4, 3), ("down", 4 + 2, 0))
ROPE_BACKWARD = (("bwd_up", 2 + 4, 0), ("bwd", 4 + 4, 3), ("bwd_down", 4 + 2, 0))
# FeedForward, per element of the product (ffn/gx per token): silu(w1 x) (sigmoid and a multiply), then times w3 x;
# backward: the multiply's gradient to each factor, then silu's (sigmoid, its derivative, the product).
SWIGLU_FORWARD = (("silu", 2 + 2, 4), ("mul", 2 + 2 + 2, 1))
SWIGLU_BACKWARD = (("mul_bwd_up", 2 + 2 + 2, 1), ("mul_bwd_gate", 2 + 2 + 2, 1), ("silu_bwd", 2 + 2 + 2, 5))
# repeat_kv, per element of the expanded k or v: read and write (the kv element read once per query head it
# serves, from cache); backward: the sum over the heads sharing it, per expanded element read, written once a group.
REPEAT_KV_BYTES = 2 + 2
