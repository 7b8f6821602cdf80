"""Benchmarks: time and memory of the training step, the loss and corpus encoding, beside peers.

Beside the package: it measures the package's code, and nothing in the package imports it.
"""
