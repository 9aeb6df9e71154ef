"""The real-GPU validation kit: ``nodehealth validate-nvml``.

It records every NVML call the probe makes on a node (``record``), the driver library's
exported NVML symbols (``elf``), the host's own view (``nvidia-smi -q``, the kernel's NVRM and
Xid lines), writes a scenario that reproduces the node in the simulator (``scenario_writer``),
replays that scenario and reports, call by call, where the simulator disagrees (``report``).
``kit.run`` ties them together. It is read-only: no NVML function that changes a GPU setting
can be called through the recorder, and Slurm is never touched. docs/validation.md.
"""
