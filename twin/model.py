"""GPT-style transformer descriptions, with parameter and FLOP accounting.

A ModelSpec is plain data: the shape of a decoder-only transformer. The
catalog holds every model named in reference/published.md; `parse_model_spec`
builds any other from `layers=..,hidden=..,heads=..`.

FLOP formulas (Narayanan et al., SC'21; reference/algorithms.md section 6),
for B sequences of length s, l layers, hidden h, vocabulary V:

- "model" (no recompute):     72 B s l h^2 (1 + s/(6h) + V/(12 l h))
- "hardware" (full recompute): 96 B s l h^2 (1 + s/(6h) + V/(16 l h))

Both the AxoNN paper and the Frontier authors' code report throughput with the
recompute form, so that is the default formula here, and the report always
names the formula it used. Both formulas assume ffn = 4h;
for other ffn sizes they are still what the papers would report. They are the
published-comparable figure only: the achieved throughput and % of peak count
the FLOPs of the ops the schedule executes (twin.report), since the formulas
overcount a plan that recomputes less or a model with a narrower ffn.
"""

from __future__ import annotations

from dataclasses import dataclass

from twin import limits
from twin.errors import TwinError

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

FLOPS_FORMULAS = ("hardware", "model")


# What each shape field counts (twin.limits): a checked range, so a typo cannot build a model no machine holds.
_FIELD_RANGES = {"layers": limits.LAYERS, "hidden": limits.WIDTH, "heads": limits.WIDTH, "seq": limits.SEQ_LEN,
                 "vocab": limits.VOCAB, "ffn": limits.WIDTH}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer. `ffn` defaults to 4 x hidden."""

    name: str
    layers: int
    hidden: int
    heads: int
    seq: int = 2048
    vocab: int = 50304  # GPT-2's 50,257 padded to a multiple of 128
    ffn: int = 0
    dtype: str = "bf16"
    # Dropout on the embedding, the attention probabilities and both residual branches, as GPT-2 and Megatron
    # train; False for models trained without it (MPT, LLaMA): no dropout kernels, masks or dropped copies.
    dropout: bool = True

    def __post_init__(self) -> None:
        if self.ffn == 0:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        for field, allowed in _FIELD_RANGES.items():
            limits.check_count(getattr(self, field), f"model {field}", allowed)
        if self.hidden % self.heads:
            raise TwinError(
                f"model hidden={self.hidden} is not divisible by heads={self.heads}; "
                "choose heads that divide hidden"
            )
        if self.dtype not in DTYPE_BYTES:
            raise TwinError(f"model dtype={self.dtype!r} is unknown; use one of {sorted(DTYPE_BYTES)}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def linear_shapes(self) -> list[tuple[str, int, int, bool]]:
        """The four linears of one block: (name, k, n, transposed).

        Every other linear is "transposed" (AxoNN swaps the roles of the X and
        Y groups) so that each output layout is the next input layout.
        """
        h, f = self.hidden, self.ffn
        return [
            ("qkv", h, 3 * h, False),
            ("attn_out", h, h, True),
            ("mlp_up", h, f, False),
            ("mlp_down", f, h, True),
        ]

    @property
    def params_per_layer(self) -> int:
        """Weights and biases of one block, layer norms included."""
        linear = sum(k * n + n for _, k, n, _ in self.linear_shapes())
        return linear + 2 * 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        """Token and position embeddings; the LM head is tied to the token embedding."""
        return self.vocab * self.hidden + self.seq * self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.params_per_layer + self.embedding_params + 2 * self.hidden

    def flops_per_step(self, sequences: int, formula: str = "hardware") -> float:
        """Training FLOPs for `sequences` sequences by Narayanan's formula."""
        B, s, l, h, V = sequences, self.seq, self.layers, self.hidden, self.vocab
        if formula == "hardware":
            return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        if formula == "model":
            return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
        raise TwinError(f"flops formula {formula!r} is unknown; use one of {list(FLOPS_FORMULAS)}")


def _gpt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads)


# reference/published.md, section A (AxoNN SC'24 Table II) and section B (Dash et al. ISC'24).
CATALOG: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        _gpt("GPT-5B", 24, 4096, 32),
        _gpt("GPT-10B", 32, 5120, 40),
        _gpt("GPT-20B", 32, 7168, 56),
        _gpt("GPT-40B", 38, 9216, 72),
        _gpt("GPT-60B", 56, 9216, 72),
        _gpt("GPT-80B", 42, 12288, 96),
        _gpt("GPT-160B", 84, 12288, 96),
        _gpt("GPT-320B", 96, 16384, 128),
        _gpt("GPT-640B", 192, 16384, 128),
        _gpt("22B", 48, 6144, 48),
        _gpt("175B", 96, 12288, 96),
        _gpt("1T", 128, 25600, 160),
        # Small enough to execute on a laptop CPU.
        ModelSpec(name="tiny", layers=2, hidden=256, heads=4, seq=128, vocab=1024),
    ]
}

SOURCES = {
    **{n: "AxoNN SC'24 (arXiv 2502.08145) Table II" for n in CATALOG if n.startswith("GPT-")},
    "22B": "Dash et al. ISC'24 (arXiv 2312.12705)",
    "175B": "Dash et al. ISC'24 (arXiv 2312.12705)",
    "1T": "Dash et al. ISC'24 (arXiv 2312.12705)",
    "tiny": "exatwin test model",
}


def _parse_int_fields(text: str, what: str, allowed: set[str]) -> dict[str, str]:
    """Parse 'a=1,b=2' into a dict, with one-line errors naming the bad item."""
    fields: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not value.strip():
            raise TwinError(f"{what}: {item!r} is not key=value (example: layers=24,hidden=4096,heads=32)")
        if key not in allowed:
            raise TwinError(f"{what}: unknown key {key!r}; allowed keys are {', '.join(sorted(allowed))}")
        if key in fields:
            raise TwinError(f"{what}: {key} is given twice; give it once")
        fields[key] = value.strip()
    return fields


def parse_switch(text: str, where: str) -> bool:
    """A 0/1 model field (dropout=0): True or False, or a one-line TwinError naming `where`."""
    if text.strip() not in ("0", "1"):
        raise TwinError(f"{where}={text!r} must be 0 or 1")
    return text.strip() == "1"


def parse_model_spec(text: str, name: str = "custom") -> ModelSpec:
    """Build a ModelSpec from 'layers=..,hidden=..,heads=..[,seq=..,vocab=..,ffn=..,dtype=..,dropout=0|1]'."""
    ints = {"layers", "hidden", "heads", "seq", "vocab", "ffn"}
    fields = _parse_int_fields(text, "--model-spec", ints | {"dtype", "dropout"})
    missing = {"layers", "hidden", "heads"} - fields.keys()
    if missing:
        raise TwinError(f"--model-spec is missing {', '.join(sorted(missing))} (example: layers=24,hidden=4096,heads=32)")
    kwargs: dict[str, object] = {}
    for key, value in fields.items():
        if key == "dtype":
            kwargs[key] = value
            continue
        if key == "dropout":
            kwargs[key] = parse_switch(value, "--model-spec dropout")
            continue
        try:
            number = int(value)
        except ValueError:
            raise TwinError(f"--model-spec {key}={value!r} is not an integer") from None
        kwargs[key] = limits.check_count(number, f"--model-spec {key}", _FIELD_RANGES[key])  # ffn=0 included
    return ModelSpec(name=name, **kwargs)  # type: ignore[arg-type]


def get_model(name: str) -> ModelSpec:
    """A catalog model by name (case-insensitive); TwinError listing the names otherwise."""
    for key, model in CATALOG.items():
        if key.lower() == name.lower():
            return model
    raise TwinError(f"unknown model {name!r}; known models: {', '.join(CATALOG)} (or use --model-spec)")
