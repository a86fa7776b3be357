"""Workloads and traces: generated Zipf traces, trace files, the real traces fetched."""
