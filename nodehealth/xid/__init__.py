"""The XID feature: from a kernel-log line to the ``gpu_xid`` check's observation.

Pure: ``events`` (the event type), ``patterns`` (every kernel-log pattern with its real sample
lines), ``parse`` (lines to events), ``catalog`` (severity and action per XID, from
``nodehealth/data/xid_catalog.toml``), ``attribution`` (PCI address → GPU, ledger → job),
``settings`` (the ``[checks.gpu_xid]`` keys). Reading the system: ``kmsg`` (the one kernel-log
reader), ``process_job`` (a live process's Slurm job), ``store`` (the per-boot event store and
the ``xid`` probe's body), ``follower`` (the daemon's follower thread). docs/xid.md.
"""
