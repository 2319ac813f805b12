"""Decoder-only transformer descriptions (GPT and Llama styles), with parameter and FLOP accounting.

A ModelSpec is plain data: the shape of a decoder-only transformer. The
catalog holds every model named in reference/published.md and Meta's Llama 2
and Llama 3.1 shapes; `parse_model_spec` builds any other from
`layers=..,hidden=..,heads=..`.

Two architectures (`arch`), because what a layer launches and holds follows
from them:

- "gpt" (GPT-2/3, Megatron's default): LayerNorm (gamma and beta), biases on
  every linear, a GeLU MLP (ffn = 4h by default), learned position
  embeddings, the LM head tied to the word table.
- "llama" (Touvron et al. 2023; Llama 3, arXiv 2407.21783): RMSNorm (gamma
  only), no biases, a SwiGLU MLP (three matrices: gate and up fused into one
  linear of 2 x ffn outputs, then down), rotary position embeddings (no
  table; a kernel on q and k), an untied LM head.

Grouped-query attention (`kv_heads` < heads, either architecture) gives K and
V kv_heads heads each: the QKV linear has h + 2 kv_heads head_dim outputs.

FLOP formulas (Narayanan et al., SC'21; reference/algorithms.md section 6),
for B sequences of length s, l layers, hidden h, vocabulary V:

- "model" (no recompute):     72 B s l h^2 (1 + s/(6h) + V/(12 l h))
- "hardware" (full recompute): 96 B s l h^2 (1 + s/(6h) + V/(16 l h))

Both the AxoNN paper and the Frontier authors' code report throughput with the
recompute form, so that is the default formula here, and the report always
names the formula it used. Both formulas assume ffn = 4h;
for other ffn sizes they are still what the papers would report. For a
Llama model they are the same sums with its linears' weights in place of
12 h^2 per layer: 6 (model) or 8 (hardware) FLOPs per weight and token, plus
attention's 12 (16) s l h and the LM head's 6 V h per token, which is how
torchtitan and Megatron-LM count Llama (6N + 12 l h s). They are the
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
                 "vocab": limits.VOCAB, "ffn": limits.WIDTH, "kv_heads": limits.WIDTH}

ARCHES = ("gpt", "llama")


def trains_with_dropout(arch: str) -> bool:
    """Whether a model of `arch` trains with dropout unless told otherwise: GPT does, Llama does not."""
    return arch != "llama"


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer. `ffn` defaults to 4 x hidden, `kv_heads` to heads (no grouped-query attention)."""

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
    kv_heads: int = 0
    arch: str = "gpt"
    # Whether the LM head is the word table (tied: GPT-2's, Megatron's default) or weights of its own (Megatron's
    # --untie-embeddings-and-output-weights; Llama's). None: what the arch usually does (GPT tied, Llama not).
    tied: bool | None = None

    def __post_init__(self) -> None:
        if self.tied is None:
            object.__setattr__(self, "tied", self.arch == "gpt")
        if self.ffn == 0:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        for field, allowed in _FIELD_RANGES.items():
            limits.check_count(getattr(self, field), f"model {field}", allowed)
        if self.hidden % self.heads:
            raise TwinError(
                f"model hidden={self.hidden} is not divisible by heads={self.heads}; "
                "choose heads that divide hidden"
            )
        if self.heads % self.kv_heads:
            raise TwinError(f"model heads={self.heads} is not divisible by kv_heads={self.kv_heads}; "
                            "choose kv_heads dividing the head count (each K/V head serves a group of query heads)")
        if self.dtype not in DTYPE_BYTES:
            raise TwinError(f"model dtype={self.dtype!r} is unknown; use one of {sorted(DTYPE_BYTES)}")
        if self.arch not in ARCHES:
            raise TwinError(f"model arch={self.arch!r} is unknown; use one of {', '.join(ARCHES)}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def gated(self) -> bool:
        """A SwiGLU MLP: its first linear holds the gate and the up projection, 2 x ffn outputs."""
        return self.arch == "llama"

    @property
    def biased(self) -> bool:
        """Biases on the linears and LayerNorm's beta (GPT); none in Llama."""
        return self.arch == "gpt"

    @property
    def tied_head(self) -> bool:
        """The LM head shares the word table (GPT's by default); else it has its own weights (Llama's by default)."""
        return bool(self.tied)

    @property
    def learned_positions(self) -> bool:
        """A learned position table (GPT); Llama rotates q and k instead (no parameters)."""
        return self.arch == "gpt"

    @property
    def kv_fraction(self) -> float:
        """K's (and V's) width over Q's: kv_heads / heads, 1 without grouped-query attention."""
        return self.kv_heads / self.heads

    def linear_shapes(self) -> list[tuple[str, int, int, bool]]:
        """The four linears of one block: (name, k, n, transposed).

        Every other linear is "transposed" (AxoNN swaps the roles of the X and
        Y groups) so that each output layout is the next input layout.
        """
        h, f = self.hidden, self.ffn
        return [
            ("qkv", h, h + 2 * self.kv_heads * self.head_dim, False),
            ("attn_out", h, h, True),
            ("mlp_up", h, (2 if self.gated else 1) * f, False),
            ("mlp_down", f, h, True),
        ]

    @property
    def norm_params(self) -> int:
        """One norm's parameters: LayerNorm's gamma and beta, RMSNorm's gamma."""
        return (2 if self.biased else 1) * self.hidden

    @property
    def linear_weights_per_layer(self) -> int:
        """The weights of one block's linears (no biases): what Narayanan's 12 h^2 counts."""
        return sum(k * n for _, k, n, _ in self.linear_shapes())

    @property
    def params_per_layer(self) -> int:
        """Weights and biases of one block, its two norms included."""
        biases = sum(n for _, _, n, _ in self.linear_shapes()) if self.biased else 0
        return self.linear_weights_per_layer + biases + 2 * self.norm_params

    @property
    def embedding_params(self) -> int:
        """The embedding module: the word table, and GPT's learned position table (Llama's rotary has none)."""
        return self.vocab * self.hidden + (self.seq * self.hidden if self.learned_positions else 0)

    @property
    def lm_head_params(self) -> int:
        """The LM head's own weights: none where it is tied to the word table."""
        return 0 if self.tied_head else self.vocab * self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.params_per_layer + self.embedding_params + self.lm_head_params + self.norm_params

    def flops_per_step(self, sequences: int, formula: str = "hardware") -> float:
        """Training FLOPs for `sequences` sequences by Narayanan's formula (module docstring; Llama's weights in
        place of 12 h^2)."""
        B, s, l, h, V = sequences, self.seq, self.layers, self.hidden, self.vocab
        if formula not in FLOPS_FORMULAS:
            raise TwinError(f"flops formula {formula!r} is unknown; use one of {list(FLOPS_FORMULAS)}")
        if self.arch == "gpt":
            if formula == "hardware":
                return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
            return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
        passes = 4 if formula == "hardware" else 3  # forward, backward's two GEMMs, and the recompute's forward
        per_token = passes * 2 * l * (self.linear_weights_per_layer + 2 * s * h) + 6 * V * h
        return float(B * s * per_token)


def _gpt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads)


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int, seq: int
           ) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=vocab,
                     seq=seq, dropout=trains_with_dropout("llama"), arch="llama")


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
        # Touvron et al., "Llama 2" (arXiv 2307.09288) and the released configs: sequence 4096, vocabulary 32,000.
        _llama("Llama-2-7B", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("Llama-2-13B", 40, 5120, 40, 40, 13824, 32000, 4096),
        _llama("Llama-2-70B", 80, 8192, 64, 8, 28672, 32000, 4096),
        # "The Llama 3 Herd of Models" (arXiv 2407.21783) Table 3: 8 K/V heads, vocabulary 128,000 (128,256 in the
        # released tokenizer); sequence 8192 in pre-training.
        _llama("Llama-3.1-8B", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("Llama-3.1-70B", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("Llama-3.1-405B", 126, 16384, 128, 8, 53248, 128256, 8192),
        # Small enough to execute on a laptop CPU.
        ModelSpec(name="tiny", layers=2, hidden=256, heads=4, seq=128, vocab=1024),
    ]
}

SOURCES = {
    **{n: "AxoNN SC'24 (arXiv 2502.08145) Table II" for n in CATALOG if n.startswith("GPT-")},
    "22B": "Dash et al. ISC'24 (arXiv 2312.12705)",
    "175B": "Dash et al. ISC'24 (arXiv 2312.12705)",
    "1T": "Dash et al. ISC'24 (arXiv 2312.12705)",
    **{n: "Touvron et al. 2023, Llama 2 (arXiv 2307.09288); released config.json" for n in CATALOG
       if n.startswith("Llama-2")},
    **{n: "Llama 3 Herd of Models (arXiv 2407.21783) Table 3; released config.json" for n in CATALOG
       if n.startswith("Llama-3")},
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
    """Build a ModelSpec from 'layers=..,hidden=..,heads=..[,seq=..,vocab=..,ffn=..,kv_heads=..,arch=gpt|llama,
    dtype=..,dropout=0|1,tied=0|1]'. arch=llama trains without dropout unless dropout=1 is given, and unties the
    LM head unless tied=1 is."""
    ints = {"layers", "hidden", "heads", "seq", "vocab", "ffn", "kv_heads"}
    fields = _parse_int_fields(text, "--model-spec", ints | {"dtype", "dropout", "arch", "tied"})
    missing = {"layers", "hidden", "heads"} - fields.keys()
    if missing:
        raise TwinError(f"--model-spec is missing {', '.join(sorted(missing))} (example: layers=24,hidden=4096,heads=32)")
    kwargs: dict[str, object] = {}
    if "dropout" not in fields:
        kwargs["dropout"] = trains_with_dropout(fields.get("arch", "gpt"))
    for key, value in fields.items():
        if key in ("dtype", "arch"):
            kwargs[key] = value
            continue
        if key in ("dropout", "tied"):
            kwargs[key] = parse_switch(value, f"--model-spec {key}")
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
