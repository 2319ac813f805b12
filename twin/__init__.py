"""exatwin: a digital twin of large-scale LLM training.

One schedule IR (twin.ir) is produced from a model and a parallel plan
(twin.builders), then simulated on a machine model (twin.sim) or executed
with torch.distributed (the separate `executor` package). This package never
imports torch.
"""

__version__ = "0.1.0"
