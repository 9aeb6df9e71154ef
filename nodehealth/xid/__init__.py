"""The XID feature's pure part: from a kernel-log line to a judged event.

``events`` (the event type, defined in ``nodehealth.observations.xid``), ``patterns`` (every
kernel-log pattern with its real sample lines), ``parse`` (lines to events), ``catalog``
(severity and action per XID, from ``nodehealth/data/xid_catalog.toml``), ``attribution`` (PCI
address → GPU, ledger → job), ``history`` (the event store's content and its changes), ``text``.
No I/O: reading the kernel log and the store's file is the probes' (``probes/kernel_log.py``,
``xid_store.py``, ``xid_follower.py``, ``process_job.py``); judging is the ``gpu_xid`` check's,
which owns the ``[checks.gpu_xid]`` settings. docs/xid.md.
"""
