"""The XID event type (``nodehealth.observations.xid``, where the XID probe's observation needs it)."""

from __future__ import annotations

from nodehealth.observations.xid import FALLEN_OFF_BUS_XID as FALLEN_OFF_BUS_XID
from nodehealth.observations.xid import KIND_FALLEN_OFF_BUS as KIND_FALLEN_OFF_BUS
from nodehealth.observations.xid import KIND_XID as KIND_XID
from nodehealth.observations.xid import Severity as Severity
from nodehealth.observations.xid import XidEvent as XidEvent
