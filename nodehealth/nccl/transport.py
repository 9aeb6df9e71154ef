"""Classify what carried NCCL's traffic, from an ``NCCL_DEBUG=INFO`` log.

The lines read, with the NCCL format strings they come from (NVIDIA/nccl, 2.4 to 2.30):

* ``INFO(NCCL_INIT, "Using network %s", comm->ncclNet->name)`` (src/init.cc, 2.7 on): the
  network plugin NCCL chose: ``IB``, ``Socket``, ``IBext`` / ``IBext_v6`` ... (the HPC-X
  SHARP plugin), ``AWS Libfabric`` (aws-ofi-nccl), ``GPUDirectTCPX``, ``FastSocket`` ...
* the connection lines, which say what each channel actually uses:

  - src/transport/net.cc ``"Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s%s"``
    (2.27 on: ``/GDRDMA``, ``(PCI)`` when GPUDirect goes through the CPU's PCI root, ``/Shared``;
    2.12 to 2.26: ``/GDRDMA`` and ``/Shared``; ``%d(%d)`` when a proxy rank (PXN) sends),
    ``%d[%lx]`` (bus id in hex) before 2.18 and ``%d[%d]`` (NVML index) since; ``Channel %02d :``
    without ``/%d`` before 2.12; ``Ring %02d : %d -> %d via NET/...`` before 2.5;
  - src/transport/p2p.cc ``via P2P/direct pointer%s``, ``via P2P/IPC%s%s``, ``via P2P/CUMEM%s%s``
    (2.18/2.19), ``via P2P/%s%s%s`` with ``CUMEM`` or ``MNNVL`` (2.20 on), the suffixes ``/read``
    and ``/CE``, ``via P2P/indirect/%d[%d]%s``;
  - src/transport/shm.cc ``via SHM/%s/%s`` (``direct``/``CE``), ``via direct shared memory`` (2.7-2.13);
  - src/transport/coll_net.cc ``CollNet %02d/%1d : %d [send] via COLLNET/%s/%d%s`` (SHARP);
  - NVLS: ``NVLS multicast support is available on dev %d`` and ``%d nvls channels`` (src/init.cc).
* ``INFO(NCCL_INIT|NCCL_NET, "NET/IB : Using%s %s; OOB %s:%s", ...)`` (src/transport/net_ib.cc)
  and ``"NET/Socket : Using%s"`` (src/transport/net_socket.cc): the devices each network
  initialised. **Trap:** NCCL before 2.7 (and plugins' fallbacks) prints ``NET/Socket : Using
  [0]eth0`` during init even when IB carries the data, and socket interfaces are often named
  ``ib0``/``ibs3`` (IP over IB: still TCP), so these lines decide only when nothing better is there.
* ``NET/OFI Selected Provider is %s`` (aws-ofi-nccl): the ``tcp``/``sockets`` libfabric providers
  are TCP, not RDMA.

``fatal`` is NCCL giving up: a WARN (src/debug.cc: ``"%s:%d:%d [%d] %s:%d NCCL WARN "``, 2.30:
``"[%d] %s:%d (%s) NCCL WARN "``, 2.27 on preceded by ``[%F %T] ``) that reports a failure —
``Call to ibv_create_qp failed`` (src/misc/ibvwrap.cc ``"Call to " name " failed"``),
``NET/IB : Got completion from peer %s with error %d`` (2.21 on ``with status=%d``,
src/transport/net_ib.cc), ``Connection closed by remote peer`` (src/misc/socket.cc), ``Cuda
failure`` —, or an application line with NCCL's error strings (``unhandled system error``,
``internal error``, ``remote process exited``, ``ncclSystemError`` ...). WARNs that NCCL follows by
carrying on are not fatal (``Failed to open libibverbs.so[.1]`` on a node without IB, ``...
ignoring``). Error unwinding lines (``net.cc:79 -> 3``) alone are not fatal: NCCL prints them
when it tries a plugin that is not there and moves on.

A fatal line that names its subsystem decides the transport, since that is the one that broke: the
network in its message (``NET/IB : Got completion ...``, ``NET/Socket : ...``) or the NCCL source file
of the WARN prefix (``transport/net_ib.cc``, ``misc/ibvwrap.cc``, ``transport/net_socket.cc``,
``transport/shm.cc``, ``transport/p2p.cc``); ``misc/socket.cc`` and ``bootstrap.cc`` are the bootstrap's and name none.

Lines are found wherever they sit in a physical line, so every prefix seen in real logs works:
``host:pid:tid [dev] NCCL INFO``, an empty hostname, ``[1,0]<stdout>:``, ``[rank0]:``, ``[0] ``,
RFC 3339 timestamps, log-collector lines.
"""

from __future__ import annotations

import re
from typing import Callable, Optional

from nodehealth.nccl.results import TransportResult

__all__ = ["classify", "net_kind"]

_MAX_ERRORS = 50
_MAX_LINE = 500

# "via ..." to the end of the line (the net name may hold spaces: "AWS Libfabric").
_VIA_RE = re.compile(r"via (?:(NET|P2P|SHM|COLLNET)/([^\r\n]*?)[ \t]*\r?$|direct shared memory)", re.MULTILINE)
_NET_TAIL_RE = re.compile(r"^(.*?)/(\d+)(?:\(\d+\))?((?:/GDRDMA)?)(?:\(PCI\))?((?:/Shared)?)$")
_USING_NETWORK_RE = re.compile(r"Using network ([^\r\n]+?)[ \t]*\r?$", re.MULTILINE)
_NET_USING_RE = re.compile(r"NET/([A-Za-z][\w .-]*?) ?: Using\b")
_OFI_PROVIDER_RE = re.compile(r"NET/OFI Selected Provider is ([^\s(]+)")
_VERSION_RE = re.compile(r"NCCL version (\d+\.\d+\.\d+\S*)")
_WARN_RE = re.compile(r"NCCL WARN ?([^\r\n]*)", re.MULTILINE)

# WARN messages that report NCCL failing (it returns an error after them).
_FATAL_WARN_RE = re.compile(
    r"failed|failure|Got completion|with error|error \d|status=|closed by|Connection reset|Connection refused"
    r"|timed? ?out|Timeout|abort|Abort|unhandled|internal error|remote process|truncated|mismatch"
    r"|wrong type|No space|out of memory|Error|ERROR|invalid usage|unreachable",
)
# WARN messages after which NCCL carries on (or only tells the user something was not used).
_BENIGN_WARN_RE = re.compile(
    r"Failed to open libibverbs|ignor|No plugin found|Could not find|Could not get|is not supported or fails to "
    r"initialize|NCCL_[A-Z_]+ set by environment|register fails|Cuda failure 'peer access is not supported",
    re.IGNORECASE,
)
# Lines outside NCCL INFO that say an NCCL call failed (NCCL's ncclGetErrorString texts, PyTorch, nccl-tests).
# (searched one by one with str.find: a regex alternation without a literal prefix scans 10x slower)
_FATAL_LINE_WORDS = (
    "unhandled system error",
    "unhandled cuda error",
    "internal error - please report",
    "remote process exited",
    "ncclSystemError",
    "ncclInternalError",
    "ncclUnhandledCudaError",
    "ncclRemoteError",
    "NCCL communicator was aborted",
    "Test NCCL failure",
    "Test CUDA failure",
    "DistBackendError",
    "ncclCommInitRank failed",
    "NCCL error in:",
    "Watchdog caught collective operation timeout",
)
# The subsystem of a failure: the network in its message, or the NCCL source file of its WARN prefix.
_FAILING_NET_RE = re.compile(r"NET/([A-Za-z][\w.-]*)")
_FAILING_FILE_RE = re.compile(r"(?<![\w.])(net_ib|ibvwrap|net_socket|coll_net|shm|p2p)\.(?:cc|cu|c):\d")
_BOOTSTRAP_FILE_RE = re.compile(r"(?<![\w.])(?:bootstrap|socket)\.(?:cc|cu|c):\d")  # misc/socket.cc, bootstrap.cc
_FAILING_FILES = {"net_ib": "ib", "ibvwrap": "ib", "coll_net": "ib", "net_socket": "socket", "shm": "p2p", "p2p": "p2p"}
_TCP_NETS = ("socket", "fastsocket", "gpudirecttcpx", "tcpx", "tcp", "fastrak")


def net_kind(name: str) -> str:
    """``ib``, ``socket`` or ``unknown`` for an NCCL network name (``IB``, ``IBext_v8``, ``Socket`` ...)."""
    low = name.strip().lower().replace(" ", "")
    if not low:
        return "unknown"
    if low.startswith("ib") or low in ("sharp", "collnet") or "sharp" in low or low.startswith("roce"):
        return "ib"
    if low.startswith("awslibfabric") or low == "ofi" or low.startswith("ofi") or low.startswith("efa"):
        return "ib"  # RDMA through libfabric (EFA, verbs); a TCP provider is caught separately
    if any(low.startswith(t) for t in _TCP_NETS):
        return "socket"
    return "unknown"


def _net_path(rest: str) -> tuple[str, str]:
    """``("NET/IB/GDRDMA", "IB")`` from what follows ``via NET/``: ``IB/0/GDRDMA``, ``Socket/3``."""
    m = _NET_TAIL_RE.match(rest)
    if not m:
        name = rest.split("/", 1)[0]
        return f"NET/{name}", name
    name = m.group(1)
    return f"NET/{name}{m.group(3)}{m.group(4)}", name


def _p2p_path(kind: str, rest: str) -> str:
    if kind == "SHM":
        words = rest.split()  # empty for a rest of only other white space (\v, \f)
        return "SHM/" + words[0] if words else "SHM"
    if kind == "COLLNET":
        return "COLLNET/" + rest.split("/", 1)[0]
    parts = [p for p in rest.split("/") if p and not p[0].isdigit()]
    if parts and parts[0].startswith("direct"):
        parts[0] = "direct"
    elif parts and parts[0] == "common device":
        parts[0] = "common"
    return "P2P/" + "/".join(parts) if parts else "P2P"


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _line_at(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start : end if end >= 0 else len(text)].strip()[:_MAX_LINE]


def _has_nvls(text: str) -> bool:
    """NVLS set up: ``NVLS multicast support is available`` (not "is not"), ``NVLS comm 0x...``, N>0 nvls channels."""
    if "NVLS multicast support is available" in text or "NVLS comm 0x" in text:
        return True
    pos = text.find(" nvls channels")
    while pos >= 0:
        start = pos
        while start > 0 and "0" <= text[start - 1] <= "9":  # ASCII only: str.isdigit takes "²", int() does not
            start -= 1
        if text[start:pos].strip("0"):  # N > 0 without int(): a 5,000-digit N is over int()'s limit
            return True
        pos = text.find(" nvls channels", pos + 1)
    return False


def _first_fatal_line(text: str) -> int:
    """Position of the first line outside NCCL INFO with one of NCCL's error texts; -1 when none."""
    best = -1
    for word in _FATAL_LINE_WORDS:
        pos = text.find(word)
        while pos >= 0 and (best < 0 or pos < best):
            if "NCCL INFO" not in _line_at(text, pos):
                best = pos
                break
            pos = text.find(word, pos + 1)
    return best


def _failing(lines: list[tuple[int, str]], kind_of: Callable[[str], str]) -> Optional[tuple[str, Optional[str], str]]:
    """``(kind, network name or None, line)`` of the first fatal line that names its subsystem; None when none does.

    ``NET/<name>`` in the message (``NET/IB : Got completion from peer ...``, ``NET/Socket : Connect to ...
    failed``, ``NET/OFI ...``) names the network; else the source file of NCCL's WARN prefix does
    (``transport/net_ib.cc:1296``, ``misc/ibvwrap.cc:268``, ``transport/net_socket.cc:404``,
    ``transport/shm.cc``, ``transport/p2p.cc``), or a verbs call (``Call to ibv_create_qp failed``).
    ``misc/socket.cc`` and ``bootstrap.cc`` name nothing (even with ``NET/Socket`` in the message): the
    bootstrap's TCP socket fails whatever carries the data.
    """
    for _, line in lines:
        if _BOOTSTRAP_FILE_RE.search(line):
            continue  # bootstrap.cc warns "NET/Socket : No usable listening interface" of its own socket
        for net in _FAILING_NET_RE.finditer(line):
            kind = kind_of(net.group(1))
            if kind != "unknown":
                return kind, net.group(1), line
        source = _FAILING_FILE_RE.search(line)
        if source:
            return _FAILING_FILES[source.group(1)], None, line
        if "Call to ibv_" in line:
            return "ib", None, line
    return None


def classify(text: str) -> TransportResult:
    """What an NCCL_DEBUG=INFO log says carried the traffic; never raises on any ``str``."""
    if not isinstance(text, str):
        raise TypeError("classify takes str (decode bytes with errors='replace')")

    paths: dict[str, None] = {}
    channel_nets: dict[str, str] = {}  # net name -> first line
    # findall + dict.fromkeys: the distinct (kind, rest) pairs in order, without a Python step per line
    for kind, rest in dict.fromkeys(_VIA_RE.findall(text)):
        if not kind:
            paths.setdefault("SHM/direct", None)
        elif kind == "NET":
            path, name = _net_path(rest)
            paths.setdefault(path, None)
            if name not in channel_nets:
                channel_nets[name] = _line_at(text, text.find(f"via NET/{rest}"))
        elif kind == "COLLNET":
            paths.setdefault(_p2p_path(kind, rest), None)
            name = rest.split("/", 1)[0]
            if name not in channel_nets:
                channel_nets[name] = _line_at(text, text.find(f"via COLLNET/{rest}"))
        else:
            paths.setdefault(_p2p_path(kind, rest), None)
    if _has_nvls(text):
        paths.setdefault("NVLS", None)

    networks: dict[str, str] = {}
    for m in _USING_NETWORK_RE.finditer(text):
        networks.setdefault(m.group(1), _line_at(text, m.start()))
    init_nets: dict[str, str] = {}
    for m in _NET_USING_RE.finditer(text):
        init_nets.setdefault(m.group(1).strip(), _line_at(text, m.start()))
    ofi = _OFI_PROVIDER_RE.search(text)
    ofi_tcp = bool(ofi and any(t in ofi.group(1).lower() for t in ("tcp", "sockets", "udp")))

    def kind_of(name: str) -> str:
        k = net_kind(name)
        if k == "ib" and ofi_tcp and name.lower().replace(" ", "").startswith(("awslibfabric", "ofi")):
            return "socket"
        return k

    def first_kind(nets: dict[str, str], order: tuple[str, ...]) -> tuple[str, list[str]]:
        """The first kind in ``order`` that one of ``nets`` has, with the evidence of each that has it."""
        kinds = {n: kind_of(n) for n in nets}
        for want in order:
            hit = [n for n, k in kinds.items() if k == want]
            if hit:
                return want, [nets[n] for n in hit]
        return "unknown", []

    transport: str = "unknown"
    evidence: list[str] = []
    if channel_nets:  # a socket path anywhere means some inter-node bytes go over TCP
        transport, evidence = first_kind(channel_nets, ("socket", "ib", "unknown"))
    elif paths:
        transport = "p2p"
    elif networks:
        transport, evidence = first_kind(networks, ("socket", "ib", "unknown"))
    elif init_nets:
        # Only the init lines: an IB (or RDMA plugin) device list wins over NET/Socket, which old
        # NCCL prints during init whatever carries the data.
        transport, evidence = first_kind(init_nets, ("ib", "socket", "unknown"))

    network = None
    if networks:
        network = list(networks)[-1]
    elif channel_nets:
        network = list(channel_nets)[0]
    elif init_nets and transport != "unknown":
        # None when the transport did not come from the init lines (p2p beside a NET/IB device list)
        network = next((n for n in init_nets if kind_of(n) == transport), None)

    errors: list[str] = []
    seen: set[str] = set()
    fatal_pos = -1
    fatal_lines: list[tuple[int, str]] = []  # (position, line) of each fatal line, in the text's order
    for m in _WARN_RE.finditer(text):
        msg = m.group(1).strip()
        line = _line_at(text, m.start())
        if line not in seen and len(errors) < _MAX_ERRORS:
            seen.add(line)
            errors.append(line)
        if len(fatal_lines) < _MAX_ERRORS and _FATAL_WARN_RE.search(msg) and not _BENIGN_WARN_RE.search(msg):
            if fatal_pos < 0:
                fatal_pos = m.start()
            fatal_lines.append((m.start(), line))
    app_pos = _first_fatal_line(text)
    if app_pos >= 0:
        line = _line_at(text, app_pos)
        if line not in seen and len(errors) < _MAX_ERRORS:
            seen.add(line)
            errors.append(line)
        if fatal_pos < 0 or app_pos < fatal_pos:
            fatal_pos = app_pos
        fatal_lines.append((app_pos, line))

    # A failure names its subsystem (NET/IB, net_socket.cc ...): that transport is the one that broke,
    # whatever the channel lines beside it say (SHM inside the node while the socket to the peer failed).
    failing = _failing(sorted(fatal_lines), kind_of)
    if failing is not None and failing[0] != transport:
        kind, failing_net, line = failing
        transport, evidence = kind, [line]
        if failing_net is not None:
            network = failing_net
        elif network is not None and kind_of(network) != kind:
            network = next((n for n in init_nets if kind_of(n) == kind), None)

    version: Optional[str] = None
    vm = _VERSION_RE.search(text)
    if vm:
        version = vm.group(1)
    return TransportResult(
        transport=transport,
        paths=tuple(paths),
        errors=tuple(errors),
        fatal=fatal_pos >= 0,
        network=network,
        nccl_version=version,
        evidence=tuple(evidence[:4]),
        fatal_line=_line_of(text, fatal_pos) if fatal_pos >= 0 else 0,
    )
