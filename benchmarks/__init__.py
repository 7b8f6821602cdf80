"""Benchmarks: time and memory of the training step, the loss and corpus encoding, beside peers.

Above train and retrieval: it measures their code, and nothing imports it but the CLI.
"""
