"""The daemon's log is ``nodehealth.platform.log.Log`` (``Log("daemon")``, ``Log.default()``): the journal with
structured fields, else stderr with the priority and the fields on the line."""

from __future__ import annotations

from nodehealth.platform.log import Log as Log
