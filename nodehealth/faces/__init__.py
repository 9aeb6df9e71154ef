"""The faces Slurm starts: ``nodehealth-prolog``, ``nodehealth-epilog``, ``nodehealth-healthcheck``.

They take no arguments (Slurm passes none), read ``NODEHEALTH_CONFIG`` or the default
config path, run with no ``PATH`` and possibly an empty ``sys.executable``, and call every
external program by an absolute, configurable path.
"""
