"""``nodehealth daemon``: the continuous watch (docs/daemon.md).

* ``core``: the ``Daemon`` (rounds, signals, state hand-off, systemd notifications).
* ``hooks``: what the daemon plugs in around its rounds: the Slurm actions (drain/resume
  through the health-check face's policy), the XID follower, the job ledger.
* ``http``: the ``/metrics`` endpoint, which serves what the last round rendered.
* ``logs``: journal (structured fields) or stderr.
"""
