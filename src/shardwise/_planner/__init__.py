"""Planners: one einsum (strategies ranked by the cost model) and device calibration."""
