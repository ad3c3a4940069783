"""Pure values and arithmetic, no devices.

Operations, meshes, specs, plans, strategies and the cost model.
"""
