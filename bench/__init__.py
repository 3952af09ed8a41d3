"""Benchmarks; run them as modules (``python -m bench.bench_parse``)."""
