"""NCCL: the local all-reduce self-test, its runners, and the parsers of what NCCL and nccl-tests print."""
