"""Prometheus metrics: what the daemon publishes on ``/metrics`` and in its textfile.

* ``families``: the table of every family (name, type, labels, help, unit); docs/metrics.md
  is generated from it.
* ``renderers``: a round's Report and NVML snapshot as families of the table.
* ``node``: ``NodeMetrics``, the daemon's state rendered once per change, and ``SlurmView``.
* ``textfile``: the node_exporter textfile, written atomically.

Everything comes from one ``CollectorRegistry`` per ``NodeMetrics`` (no global default
collectors; the daemon adds ``ProcessCollector``, which reads ``/proc/self``, by choice).
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
