"""The parts of a driver payload the parser and the catalog read: the blamed process at the start of
an Xid payload, XID 154's recovery action, the word "Fatal". Entries of the one table,
``nodehealth.xid.patterns.PATTERNS``; each with its real sample lines. Pure: ``re`` only, nothing
compiled at import.
"""

from __future__ import annotations

import re

from nodehealth.xid.pattern_kit import (
    CATALOG_NOTES,
    GPUD_KMSG_EXTENDED_TEST,
    GPUD_KMSG_TEST,
    GPUD_XID119_LOG,
    NVIDIA_GA100,
    PART,
    TESTS,
    Pattern,
    Regex,
    gives,
    no_match,
)

# --------------------------------------------------------------------------- parts of a payload

PROCESS = Pattern(
    name="process",
    role=PART,
    about="the blamed process at the start of an Xid payload: `pid=<n>[, name=<name>], `; "
    "`pid='<unknown>'` and `name=<unknown>` name nobody",
    regex=Regex(r"^pid=(?:'?<unknown>'?|(?P<pid>\d+))\s*(?:,\s*|$)(?:name=(?P<name>[^,]*?)\s*(?:,\s*|$))?"),
    samples=(
        gives(
            "pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP!",
            GPUD_XID119_LOG + " (line 3)",
            pid="2024380",
            name="nvidia-smi",
        ),
        gives(
            "pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 Link 13",
            GPUD_KMSG_EXTENDED_TEST,
            pid="876767",
            name="ray::WorkerDict",
        ),
        gives("pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No", NVIDIA_GA100, pid="7194", name=None),
        gives(
            "pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)",
            TESTS,
            pid=None,
            name="<unknown>",
        ),
        no_match(
            "NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 "
            "0x00000000)",
            GPUD_KMSG_TEST,
        ),
    ),
)

RECOVERY_ACTION = Pattern(
    name="recovery_action",
    role=PART,
    about="XID 154's payload: the GPU recovery action the driver now asks for (code and name); the catalog "
    "judges the event by it",
    regex=Regex(
        r"recovery action changed from\s+(?P<old>0x[0-9a-fA-F]+|\d+)\s*(?:\((?P<old_name>[^)]*)\))?"
        r"\s*to\s+(?P<new>0x[0-9a-fA-F]+|\d+)\s*(?:\((?P<new_name>[^)]*)\))?",
        re.IGNORECASE,
    ),
    samples=(
        gives(
            "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
            GPUD_KMSG_TEST,
            old="0x0",
            new="0x4",
            new_name="Drain and Reset",
        ),
        gives(
            "GPU recovery action changed from 0x4 (Drain and Reset) to 0x1 (GPU Reset Required)",
            GPUD_KMSG_TEST,
            old="0x4",
            old_name="Drain and Reset",
            new="0x1",
            new_name="GPU Reset Required",
        ),
        gives(
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            CATALOG_NOTES,
            new="0x2",
            new_name="Node Reboot Required",
        ),
        gives(
            "GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)", CATALOG_NOTES, new="0x1", new_name="PF FLR"
        ),
        no_match("NETIR_LINK_EVT  Fatal   XC0 i0 Link 01", GPUD_KMSG_TEST),
    ),
)

FATAL = Pattern(
    name="fatal",
    role=PART,
    about="the word Fatal in an NVLink5 payload (XIDs 144-150 print Fatal or Nonfatal per event); the "
    "catalog's fatal severity applies",
    regex=Regex(r"\bFatal\b"),
    samples=(
        gives(
            "NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 "
            "0x00000000)",
            GPUD_KMSG_TEST,
        ),
        no_match(
            "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
            GPUD_KMSG_EXTENDED_TEST,
        ),
    ),
)


# The parts in the table's order (``patterns.PATTERNS``: after the events and the context).
PARTS: tuple[Pattern, ...] = (PROCESS, RECOVERY_ACTION, FATAL)
