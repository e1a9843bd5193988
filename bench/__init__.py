"""``petal bench``: throughput and latency measured against named baselines in the same run.

A claim about speed is a ratio measured in one run (PERFORMANCE.md); nothing here is a unit test.
"""
