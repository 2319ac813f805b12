"""Builders: pure functions (ModelSpec, ParallelPlan) -> Schedule. The parallel algorithms live here and nowhere else.

twin.builders.schedule.build_schedule is the entry; its docstring lists the
passes, in order, and the module of each.
"""
