"""Operators' tools: the trace-driven warm-pool simulator, its traces and sweeps."""
