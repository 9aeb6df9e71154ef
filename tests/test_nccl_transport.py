"""nodehealth.nccl.transport and ``nodehealth nccl transport``: real NCCL_DEBUG logs, exact values; bad input."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

from nodehealth.nccl import cli_parse
from nodehealth.nccl.transport import classify, net_kind

FIXTURES = Path(__file__).parent / "fixtures" / "real-world" / "nccl_debug"
EXPECTED = {k: v for k, v in json.loads((FIXTURES / "expected.json").read_text()).items() if not k.startswith("_")}
KINDS = {"ib", "socket", "p2p", "unknown"}


def text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_every_fixture_file_has_an_expected_entry():
    assert {p.name for p in FIXTURES.glob("*.txt")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_exact(name):
    exp = EXPECTED[name]
    res = classify(text(name))
    want = exp["transport"] if exp["transport"] in KINDS else exp["classification"]
    assert res.transport == want
    assert res.fatal is exp["fatal_error"]
    for key, attr in (("network", "network"), ("fatal_line", "fatal_line"), ("nccl_version", "nccl_version")):
        if key in exp:
            assert getattr(res, attr) == exp[key], key
    if "paths" in exp:
        assert list(res.paths) == exp["paths"]
    if "num_errors" in exp:
        assert len(res.errors) == exp["num_errors"]
    if res.fatal:
        assert res.errors, "a fatal log names its error line"


def test_wrapped_warn_line_is_reported_by_its_first_half():
    res = classify(text("error_ml_engineering_azure_ib_completion.txt"))
    assert len(res.errors) == 1 and "Got completion from peer 10.2.0.5<33092> with error 12" in res.errors[0]


def test_libfabric_plugin_failure_is_not_fatal_and_ib_decides():
    res = classify(text("ib_roce_sglang_nccl2275_libfabric_fallback.txt"))
    assert res.transport == "ib" and not res.fatal and res.errors == ()
    assert any("via NET/IB/" in e for e in res.evidence)


# --------------------------------------------------------------------------- formats and traps from NCCL's source


def test_old_socket_init_line_does_not_override_ib():
    # NCCL < 2.7 prints "NET/Socket : Using" at init even when the channels run over NET/IB
    log = (
        "n1:1:1 [0] NCCL INFO NET/Socket : Using [0]ib0:10.0.0.1<0>\n"
        "n1:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>\n"
    )
    assert classify(log).transport == "ib"
    log += "n1:1:2 [0] NCCL INFO Ring 00 : 0 -> 1 [send] via NET/IB/0\n"
    assert classify(log).transport == "ib"


def test_socket_over_an_ib0_interface_is_socket():
    log = (
        "n1:1:1 [0] NCCL INFO NET/Socket : Using [0]ib0:10.0.0.1<0>\nn1:1:1 [0] NCCL INFO Using network Socket\n"
        "n1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n"
    )
    res = classify(log)
    assert res.transport == "socket" and res.network == "Socket" and res.paths == ("NET/Socket",)


@pytest.mark.parametrize(
    "line,path",
    [
        ("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read", "P2P/CUMEM/read"),
        ("Channel 00/0 : 0[0] -> 1[1] via P2P/direct pointer/read", "P2P/direct/read"),
        ("Channel 00/1 : 0[0] -> 1[1] via P2P/MNNVL/read/CE", "P2P/MNNVL/read/CE"),
        ("Channel 00/0 : 0[0] -> 2[2] via P2P/indirect/1[1]/read", "P2P/indirect/read"),
        ("Channel 00 : 0[0] -> 1[1] via SHM/CE/direct", "SHM/CE/direct"),
        ("Channel 00 : 0[7000] -> 1[8000] via direct shared memory", "SHM/direct"),
    ],
)
def test_intra_node_paths(line, path):
    res = classify(f"h:1:2 [0] NCCL INFO {line}\nh:1:2 [0] NCCL INFO Using network IB\n")
    assert res.transport == "p2p" and res.paths == (path,)


@pytest.mark.parametrize(
    "line,path,network",
    [
        ("Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA(PCI)", "NET/IB/GDRDMA", "IB"),  # 2.27
        ("Channel 02/1 : 3[3] -> 11[3] [send] via NET/IB/3(11)/GDRDMA/Shared", "NET/IB/GDRDMA/Shared", "IB"),  # PXN
        ("Channel 00/0 : 0[0] -> 8[0] [send] via NET/IBext_v8/0/GDRDMA", "NET/IBext_v8/GDRDMA", "IBext_v8"),
        (
            "Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA",
            "NET/AWS Libfabric/GDRDMA",
            "AWS Libfabric",
        ),
        ("CollNet 00/0 : 0 [send] via COLLNET/SHARP/0/GDRDMA", "COLLNET/SHARP", "SHARP"),
    ],
)
def test_net_paths_and_plugins(line, path, network):
    res = classify(f"[2025-01-01 10:00:00] h:1:2 [0] NCCL INFO {line}\n")
    assert res.transport == "ib" and res.paths == (path,) and res.network == network


def test_a_socket_channel_anywhere_makes_it_socket():
    log = (
        "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA\n"
        "h:1:2 [1] NCCL INFO Channel 00/0 : 1[1] -> 9[1] [send] via NET/Socket/0\n"
    )
    assert classify(log).transport == "socket"


def test_libfabric_over_tcp_provider_is_socket():
    log = (
        "h:1:2 [0] NCCL INFO NET/OFI Selected Provider is tcp;ofi_rxm (found 4 nics)\n"
        "h:1:2 [0] NCCL INFO Using network AWS Libfabric\n"
    )
    assert classify(log).transport == "socket"


def test_nvls():
    log = (
        "h:1:2 [0] NCCL INFO NVLS multicast support is available on dev 0 (NVLS_NCHANNELS 16)\n"
        "h:1:2 [0] NCCL INFO 24 coll channels, 24 collnet channels, 16 nvls channels, 32 p2p channels\n"
        "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
    )
    res = classify(log)
    assert res.transport == "p2p" and set(res.paths) == {"P2P/CUMEM/read", "NVLS"}


@pytest.mark.parametrize(
    "line,fatal",
    [
        ("h:1:2 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]", False),
        (
            "h:1:2 [0] init.cc:418 NCCL WARN NCCL_WORK_FIFO_DEPTH=3 is being ignored because it is not a power of 2.",
            False,
        ),
        (
            "h:1:2 [0] net_ib.cc:148 NCCL WARN NET/IB: Ip address 'x' is invalid for family AF_INET, ignoring address",
            False,
        ),
        ("h:1:2 [0] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer n2<4283>", True),
        (
            "h:1:2 [0] misc/ibvwrap.cc:187 NCCL WARN Call to ibv_modify_qp failed with error Network is unreachable",
            True,
        ),
        ("h:1:2 [0] enqueue.cc:1 (ncclLaunch) NCCL WARN Cuda failure 'out of memory'", True),
        ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error, NCCL version 2.10.3", True),
        ("h:1:2 [0] NCCL INFO transport/net.cc:1134 -> 6", False),
        ("h:1:2 [0] NCCL INFO NET/IB : No device found.", False),
    ],
)
def test_fatal_or_benign(line, fatal):
    res = classify(line + "\n")
    assert res.fatal is fatal
    assert bool(res.errors) is ("WARN" in line or fatal)


def test_net_kind():
    assert [net_kind(n) for n in ("IB", "IBext", "IBext_v6", "Socket", "FastSocket", "GPUDirectTCPX", "mesh", "")] == [
        "ib",
        "ib",
        "ib",
        "socket",
        "socket",
        "socket",
        "unknown",
        "unknown",
    ]


# --------------------------------------------------------------------------- bad input


def test_empty_and_garbage():
    assert classify("").transport == "unknown"
    assert classify("\x00\xff\ufffd" * 1000).transport == "unknown"


def test_fifty_megabytes_bounded_output():
    one = text("error_nccl_562_ibext_create_qp.txt") + text("ib_nccl_1189_h20_gdrdma_cumem.txt")
    big = one * (50_000_000 // len(one) + 1)
    res = classify(big)
    assert res.transport == "ib" and res.fatal and res.fatal_line == 4
    assert len(res.errors) <= 50 and len(res.evidence) <= 4


def test_fuzz_never_raises():
    rng = random.Random(99)
    sources = [text(n) for n in EXPECTED]
    for _ in range(2000):
        s = rng.choice(sources)
        i = rng.randrange(len(s) + 1)
        op = rng.randrange(4)
        if op == 0:
            s = s[:i]
        elif op == 1:
            s = s[:i] + "".join(chr(rng.randrange(0, 0x3000)) for _ in range(rng.randrange(1, 30))) + s[i:]
        elif op == 2:
            lines = s.splitlines(True)
            rng.shuffle(lines)
            s = "".join(lines)
        else:
            s = s.replace("NCCL", rng.choice(["", "NCC", "NCCL NCCL"]), rng.randrange(1, 20))
        res = classify(s)
        assert res.transport in KINDS
        json.dumps(cli_parse.transport_dict(res))


# --------------------------------------------------------------------------- the command


def run(argv, stdin=b""):
    out, err = io.StringIO(), io.StringIO()
    code = cli_parse.main(argv, out=out, err=err, stdin=io.BytesIO(stdin))
    return code, out.getvalue(), err.getvalue()


def test_command_json():
    code, out, err = run(["transport", str(FIXTURES / "error_nccl_380_roce_create_cq.txt"), "--format", "json"])
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert doc["transport"] == "ib" and doc["fatal"] is True and doc["network"] == "IB"
    assert doc["errors"] and "ibv_create_cq" in doc["errors"][0] and doc["paths"] == ["NET/IB"]


def test_command_stdin_non_utf8_and_text():
    data = (FIXTURES / "socket_nccl_1053_lo_loopback.txt").read_bytes() + b"\xff\xfe\n"
    code, out, _ = run(["transport", "-"], stdin=data)
    assert code == 0 and "transport: socket" in out


def test_command_missing_file():
    code, out, err = run(["transport", "/nonexistent/log", "--format", "json"])
    assert code == 2 and out == "" and err.count("\n") == 1
