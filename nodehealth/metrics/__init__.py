"""Prometheus metrics: what the daemon publishes on ``/metrics`` and in its textfile.

* ``families``: the table of every family (name, type, labels, help, unit, what the default
  page carries of it: ``family``); docs/metrics.md is generated from it.
* ``renderers``: a round's Report and NVML snapshot as families of the table.
* ``node``: ``NodeMetrics``, the daemon's state rendered once per change, and ``SlurmView``.
* ``textfile``: the node_exporter textfile, written atomically.

* ``exposition``: the text format and the ``process_*`` figures (read from ``/proc/self``),
  written by us: the daemon does not import prometheus_client (12 MiB of its memory).
* ``budget``: the series budget, counted from the table.

Everything comes from the families ``NodeMetrics`` renders (no global default collectors).
Names follow ``nodehealth_<area>_<thing>_<unit>``.

Adding a metric: a row in ``families.FAMILIES`` and the line that gives its value (for a
per-GPU value read straight from a ``GpuObservation``, a line in ``renderers.GPU_VALUES``);
then ``pytest tests/test_metrics.py --update-golden`` regenerates docs/metrics.md and the
golden exposition.
"""

from nodehealth.metrics.node import CONTENT_TYPE, NodeMetrics, SlurmView
from nodehealth.metrics.renderers import probe_timeouts
from nodehealth.metrics.textfile import textfile_path, write_textfile

__all__ = ["CONTENT_TYPE", "NodeMetrics", "SlurmView", "probe_timeouts", "textfile_path", "write_textfile"]
