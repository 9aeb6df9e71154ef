"""The one recipe for the configuration a face, a command or the daemon runs with.

``use`` does, in this order: find the file (``--config``, ``$NODEHEALTH_CONFIG``, the default path),
the trust check (running as root, a file others can change is refused), load and validate it, fall
back when it does not validate (``fallback``), apply ``--simulate`` (the one place it is applied:
an absolute path in ``[nvml] simulate``), then check what the probes need of it (a scenario that
parses, the simulator installed).

* ``fallback="defaults"`` (the faces, ``status``, ``check --as``): a file that does not validate gives
  the last configuration that validated on this node, else the built-in defaults, with the error in
  ``Loaded.error``: a bad edit never switches the checks off;
* ``fallback="last_good"`` (the daemon): the same without the defaults (nothing to fall back on
  raises, so systemd's ``RestartPreventExitStatus=2`` applies);
* ``fallback="none"`` (the commands a person runs): the file's own config or ``ConfigError``; nothing
  is recorded as last good.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional

from nodehealth.config.loader import ConfigError, Loaded, load, load_safe
from nodehealth.config.schema import Config

FALLBACKS = ("defaults", "last_good", "none")


def use(
    path: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
    *,
    fallback: str = "defaults",
    simulate: Optional[str] = None,
    remember: bool = True,
    host: Optional[str] = None,
    setup: bool = True,
) -> Loaded:
    """The configuration to run with (see the module's doc). ``setup``: check what the probes need
    (a bad scenario is a ``ConfigError`` with ``fallback="none"`` or a ``--simulate``; else it makes the
    file invalid and the fallback applies). ``host``: resolve ``[[override]]`` for that node (only
    with ``fallback="none"``)."""
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback: one of {FALLBACKS}, not {fallback!r}")
    check = probe_setup if setup and not simulate else None
    if fallback == "none":
        cfg = load(path, host=host, environ=environ)
        loaded = Loaded(cfg, cfg.source)
    else:
        if host is not None:
            raise ValueError("host: only with fallback='none'")
        loaded = load_safe(path, environ=environ, check=check, remember=remember, defaults=fallback == "defaults")
    if simulate:
        loaded = dataclasses.replace(loaded, cfg=simulated(loaded.cfg, simulate))
    if setup and (simulate or fallback == "none"):
        probe_setup(loaded.cfg)
    return loaded


def simulated(cfg: Config, scenario: str) -> Config:
    """``cfg`` running on the simulated GPUs of ``scenario`` (``--simulate``; relative to the cwd)."""
    return dataclasses.replace(cfg, nvml=dataclasses.replace(cfg.nvml, simulate=os.path.abspath(scenario)))


def probe_setup(cfg: Config) -> None:
    """What the probes need of a config (a scenario file that parses), as a ConfigError.

    The ``check`` the faces and the daemon give ``load_safe``/``load_valid``. Here, not in the loader:
    the loader is below the probes, this recipe above them.
    """
    from nodehealth.probes import ProbeSetupError, validate

    try:
        validate(cfg)
    except ProbeSetupError as exc:
        raise ConfigError(str(exc), "setup") from None


__all__ = ["ConfigError", "Loaded", "probe_setup", "simulated", "use"]
