"""What the NCCL parsers return: ``nodehealth.observations.nccl`` (the ``nccl`` probe's observation holds it)."""

from __future__ import annotations

from nodehealth.observations.nccl import ParseError as ParseError
from nodehealth.observations.nccl import PerfResult as PerfResult
from nodehealth.observations.nccl import PerfRow as PerfRow
from nodehealth.observations.nccl import TransportResult as TransportResult
