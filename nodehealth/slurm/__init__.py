"""Slurm: node parsing, the scontrol client, the pure policy, and the one act sequence."""
