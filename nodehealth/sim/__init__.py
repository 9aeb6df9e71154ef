"""Simulated GPUs for development and tests (docs/simulation.md)."""
