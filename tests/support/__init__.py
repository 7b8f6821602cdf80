"""Helpers for the tests and the toy data: the tiny BERT builder, small random inputs, the CLI
run as a user runs it, and the distributed test cases."""
