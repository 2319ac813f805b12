"""A batch given in tokens ("16.8M"), as a whole number of sequences.

A count written with three significant figures stands for any number that
rounds to it: "16.8M" is 16.75M..16.85M tokens. Of the sequence counts in that
range, the one with the most factors of two is taken (it divides over the
most data-parallel groups): 16.8M tokens at sequence length 2048 is 8,192
sequences, AxoNN's batch (2^24 tokens, which the paper rounds to 16.8M).
A count written exactly ("16777216") is taken as it is.
"""

from __future__ import annotations

import re

from twin import limits
from twin.errors import TwinError

_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}


def sequences_for_tokens(text: str, seq: int) -> int:
    match = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?\s*([kKmMgGbB]?)\s*", text)
    if not match:
        raise TwinError(f"--batch-tokens {text!r} is not a token count; write e.g. 16.8M, 4M or 16777216")
    whole, frac, suffix = match.group(1), match.group(2) or "", match.group(3).lower()
    scale = _SUFFIX[suffix]
    if len(whole) > 15:  # beyond any batch (twin.limits.TOKENS), and beyond a float's exact integers
        raise TwinError(f"--batch-tokens {text}: out of range; give at most {limits.TOKENS.hi:.0e} tokens")
    value = float(f"{whole}.{frac}" if frac else whole) * scale
    limits.TOKENS.check(value, "--batch-tokens")
    if not suffix and not frac:  # an exact integer count
        if value % seq:
            raise TwinError(f"--batch-tokens {text}: {int(value)} tokens are not a whole number of "
                            f"{seq}-token sequences; use a multiple of {seq}")
        return int(value) // seq
    half_unit = 0.5 * scale / 10 ** len(frac)
    lo, hi = max(1, int(-(-(value - half_unit) // seq))), int((value + half_unit) // seq)
    if hi < lo:
        raise TwinError(f"--batch-tokens {text} holds no whole number of {seq}-token sequences; give more digits")
    return _most_twos(lo, hi, value / seq)


def _most_twos(lo: int, hi: int, target: float) -> int:
    """The n in lo..hi with the most factors of two, nearest `target` (the smaller on a tie), in O(log hi):
    the largest power of two with a multiple in the range; every such multiple has exactly that many twos."""
    step = 1 << hi.bit_length()
    while -(-lo // step) * step > hi:
        step >>= 1
    first, last = -(-lo // step) * step, hi // step * step
    near = int(target // step) * step
    candidates = {c for c in (first, last, near, near + step) if first <= c <= last}
    return min(candidates, key=lambda n: (abs(n - target), n))
