"""The discrete-event simulator: runs a Schedule on a machine model (SimPy)."""
