"""Shared reliability helpers: exit-coded errors, fault points, signals, durable writes, step guards."""
