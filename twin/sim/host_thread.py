"""A simulated rank's host thread: when the framework issues each op of its program.

A framework issues a rank's ops from one host thread, in program order, and
on a small model the host, not the device, sets the pace (PyTorch eager
spends tens of microseconds of Python and driver time per op). With the
device's `launch_interval_s` > 0 each op is issued that long after the
previous one and cannot start before it is issued (twin.sim.engine); the host
runs ahead of the device otherwise (the launch queue), except that it waits
for every point-to-point transfer an op depends on (Megatron synchronises the
device after its pipeline transfers), so after a pipeline receive the device
waits for the host again. With 0 (every machine file that does not measure
it) there is no host and nothing changes.
"""

from __future__ import annotations

import numpy as np
import simpy

from twin.ir import P2P, Program


class HostThread:
    """The host thread of one simulated rank (module docstring): when each op of its program is issued.

    `issue_s[i]` is op i's issue time once the host has reached it (NaN before);
    `synced[i]` names the transfer the host waited for before issuing op i, where
    that wait, not the host's own pace, set the issue time. `ends`: the rank's
    op end times as the engine writes them (a list during the run, the
    timeline's array after it), which the host reads for its transfers.
    """

    def __init__(self, env: simpy.Environment, program: Program, interval_s: float,
                 done: list[simpy.Event | None], ends: list[float] | np.ndarray) -> None:
        self.env, self.program, self.interval_s, self.done, self.ends = env, program, interval_s, done, ends
        self.issue_s = np.full(len(program.ops), np.nan)
        self.synced: dict[int, int] = {}
        self._progress = env.event()

    def progressed(self) -> simpy.Event:
        """An event that fires when the host has issued more ops."""
        return self._progress

    def _announce(self) -> None:
        event, self._progress = self._progress, self.env.event()
        event.succeed()

    def run(self):
        ops, issued = self.program.ops, 0.0
        for op in ops:
            syncs = [d for d in op.deps if isinstance(ops[d].work, P2P)]
            if syncs:
                pending = [self.done[d] for d in syncs if not self.done[d].processed]
                if pending:
                    self._announce()
                    for event in pending:
                        yield event
                last = max(syncs, key=lambda d: self.ends[d])
                if self.ends[last] > issued:
                    issued = float(self.ends[last])
                    self.synced[op.id] = last
            issued += self.interval_s
            self.issue_s[op.id] = issued
        self._announce()
