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

Its RMSNorms are the plan's `norm`, chosen apart as torchtitan's configs
choose them: the page's 8B and 13B runs set fused_rmsnorm (a Triton kernel
each way, which the fused count already is), its 70B runs "rmsnorm", torch's
RMSNorm module (torchtitan/models/norms.py), which runs

- forward: x.float(), pow(2), mean over the hidden, + eps and rsqrt on one
  value a token, x times that, type_as(x), times the weight;
- backward, autograd's reverse: the weight product's two gradients (the
  input's, and the weight's as a product summed over the tokens), the casts'
  and the scaling's (the per-token factor's gradient a product summed over
  the hidden), rsqrt's on one value a token, mean's broadcast, pow's (a copy
  for self.pow(1), the factor 2, the product: PyTorch's pow_backward), the
  sum of x's two fp32 gradients, and the cast back to bf16; it saves the
  fp32 copy of x and the cast-down output (twin.memory).

Each kernel is counted as what it must read and write per element of its
output [estimate: from the code, not a kernel trace]: (role, bytes, flops)
per element, bf16 tensors 2 bytes and their fp32 copies 4; the RMSNorm's
also say whether they walk every element of the residual stream (ELEMENT)
or one value a token (ROW).
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

# torch's RMSNorm module (norm=eager), per element of the residual stream or per token: (role, bytes, flops, per).
ELEMENT, ROW = "element", "row"
RMSNORM_FORWARD = (("up", 2 + 4, 0, ELEMENT), ("pow", 4 + 4, 1, ELEMENT), ("mean", 4, 1, ELEMENT),
                   ("eps", 4 + 4, 1, ROW), ("rsqrt", 4 + 4, 1, ROW), ("scale", 4 + 4, 1, ELEMENT),
                   ("down", 4 + 2, 0, ELEMENT), ("weight", 2 + 2, 1, ELEMENT))
RMSNORM_BACKWARD = (("weight_bwd", 2 + 2, 1, ELEMENT), ("weight_grad_mul", 2 + 2 + 2, 1, ELEMENT),
                    ("weight_grad_sum", 2, 1, ELEMENT), ("down_bwd", 2 + 4, 0, ELEMENT),
                    ("scale_bwd", 4 + 4, 1, ELEMENT), ("scale_grad_mul", 4 + 4 + 4, 1, ELEMENT),
                    ("scale_grad_sum", 4, 1, ELEMENT), ("rsqrt_bwd", 4 + 4 + 4, 3, ROW),
                    ("mean_bwd", 4, 1, ELEMENT), ("pow_bwd_copy", 4 + 4, 0, ELEMENT),
                    ("pow_bwd_scale", 4 + 4, 1, ELEMENT), ("pow_bwd_mul", 4 + 4 + 4, 1, ELEMENT),
                    ("up_grad_add", 4 + 4 + 4, 1, ELEMENT), ("up_bwd", 4 + 2, 0, ELEMENT))
# What the module keeps for its backward beyond a fused norm's input: the fp32 copy of x in place of the bf16 input
# (2 bytes more an element) and the cast-down output the weight's product saves (2 more).
RMSNORM_SAVED_EXTRA_BYTES = 2 + 2
