"""The process and its machine.

Simulated devices, the distributed runtime, launch, host memory and timing.
"""
