"""Where each rank runs: rank r on GPU r of the job.

GPUs are numbered node-major: GPU g is device ``g % gpus_per_node`` of the
job's node ``g // gpus_per_node``, and the job takes the machine's first
nodes. Mapping rank r to GPU r therefore puts consecutive ranks on
consecutive devices of one node. Plans order their mesh axes by increasing
network intensity with the innermost (most talkative) axis varying fastest
over ranks, as JAX's mesh_utils does, so the innermost parallel axis lands
inside a node on the fast links, and outer axes cross NICs and the dragonfly.

A pure function: no machine state, no global counters.
"""

from __future__ import annotations

from topologies.errors import InputError
from topologies.specs import Machine


def place_ranks(n_ranks: int, machine: Machine) -> list[int]:
    """GPU index of each rank: ``[0, 1, ..., n_ranks - 1]``.

    Worked example, Frontier (8 GCDs per node), a plan with tensor parallel
    size 8 innermost and data parallel size 2 outside it (16 ranks)::

        >>> from topologies import load_machine
        >>> place_ranks(16, load_machine("frontier"))[:10]
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]

    Ranks 0-7 (the first tensor-parallel group) are GCDs 0-7 of node 0 and
    share its Infinity Fabric; ranks 8-15 are node 1. Data-parallel peers
    (0, 8), (1, 9), ... sit on different nodes and talk over the NICs.
    On Perlmutter (4 GPUs per node) the same 16 ranks fill nodes 0-3, with
    rank 5 on GPU 1 of node 1.
    """
    if n_ranks < 1:
        raise InputError(f"n_ranks: must be >= 1, got {n_ranks}")
    if n_ranks > machine.max_gpus:
        raise InputError(f"n_ranks: {n_ranks} exceeds the {machine.max_gpus} GPUs of machine "
                        f"'{machine.name}'; use at most {machine.max_gpus} ranks")
    return list(range(n_ranks))
