"""Builders: pure functions (ModelSpec, ParallelPlan) -> Schedule. The parallel algorithms live here and nowhere else."""
