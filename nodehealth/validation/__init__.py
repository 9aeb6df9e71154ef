"""The real-GPU validation kit: ``nodehealth validate-nvml``.

It records every NVML call the probe makes on a node (``record``), the driver library's
exported NVML symbols (``elf``), the host's own view (``nvidia-smi -q``, the kernel's NVRM and
Xid lines) and a report of timings (``report``); ``kit.run`` ties them together. Writing the
scenario that reproduces the node and replaying it in the simulator is the simulator's half
(``nodehealth_sim.validation``, distribution nodehealth-sim): ``kit`` calls it by name when it is
installed, and the record can be replayed later elsewhere (``nodehealth-sim replay DIR``).
It is read-only: no NVML function that changes a GPU setting can be called through the recorder,
and Slurm is never touched. docs/validation.md.
"""
