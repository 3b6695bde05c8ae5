"""Fuzzing helpers: mutations of real traces, shared by the hypothesis test, the atheris
target and benchmarks/fuzz_import.py."""
