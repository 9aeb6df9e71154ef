"""``nodehealth nccl transport`` on any log: rank prefixes, cut and shuffled real logs, junk; the failing subsystem.

The real logs are tests/fixtures/real-world/nccl_debug (each file's source in its expected.json). The line
formats are NCCL's own (src/debug.cc's WARN/INFO prefix with the source file, src/transport/net_ib.cc
``NET/IB : Got completion from peer %s with error %d``, src/transport/net_socket.cc ``NET/Socket : ...``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from nodehealth.nccl import cli_parse
from nodehealth.nccl.transport import classify

FIXTURES = Path(__file__).parent / "fixtures" / "real-world" / "nccl_debug"
NAMES = sorted(p.name for p in FIXTURES.glob("*.txt"))
KINDS = {"ib", "socket", "p2p", "unknown"}
# Prefixes launchers and collectors put before every line: nccl-tests/mpirun's "[0] ", Open MPI's
# --tag-output, torchrun's "[rank0]:", srun --label, an RFC 3339 timestamp.
PREFIXES = ("[0] ", "[3] ", "[1,0]<stdout>:", "[rank0]:", "[rank12]: ", "0: ", "2024-05-01T10:00:00.123456Z ")


def text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def prefixed(s: str, prefix: str) -> str:
    return "".join(prefix + line for line in s.splitlines(True))


def key(res):  # what the command decides (the error lines themselves carry the prefix)
    return (res.transport, res.paths, res.network, res.fatal, res.fatal_line, res.nccl_version, len(res.errors))


# --------------------------------------------------------------------------- logs that raised


MIXED_IB_ROCE_P2P = (
    "[0] gpu1:100:100 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>\n"
    "[0] gpu1:100:100 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read\n"
    "[1] gpu1:101:101 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/IPC/read\n"
)


@pytest.mark.parametrize(
    "log,transport",
    [
        (MIXED_IB_ROCE_P2P, "p2p"),  # was StopIteration: the init lines' network looked up for "p2p"
        ("gpu1:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/\x0b\n", "p2p"),  # was IndexError
        ("gpu1:1:1 [0] NCCL INFO " + "7" * 5000 + " nvls channels\n", "p2p"),  # was int()'s digit limit
        ("gpu1:1:1 [0] NCCL INFO \u00b2 nvls channels\n", "unknown"),  # was int('²'): not an ASCII count
        ("gpu1:1:1 [0] NCCL INFO 000 nvls channels\n", "unknown"),  # zero NVLS channels is no NVLS
    ],
    ids=["mixed-ib-roce-with-p2p", "shm-vertical-tab", "5000-digit-nvls", "superscript-digit", "zero-nvls"],
)
def test_logs_that_raised(log, transport):
    assert classify(log).transport == transport
    assert classify(log + log).transport == transport


def test_mixed_ib_roce_command_exits_0(tmp_path, capsys):
    from nodehealth import cli  # the whole CLI, whose last resort answers "internal error", exit 3

    path = tmp_path / "nccl.log"
    path.write_text(MIXED_IB_ROCE_P2P)
    assert cli.main(["nccl", "transport", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["transport"] == "p2p" and doc["paths"] == ["P2P/IPC/read"] and doc["network"] is None


# --------------------------------------------------------------------------- the failing subsystem decides

AZURE = "error_ml_engineering_azure_ib_completion.txt"
IB_COMPLETION = (
    "node-2:5776:5902 [0] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from peer "
    "10.2.0.5<33092> with error 12, opcode 0, len 0, vendor err 129 (Recv)\n"
)
SHM_CHANNELS = (
    "gpu1:100:100 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct\n"
    "gpu1:100:100 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via SHM/direct/direct\n"
)
SOCKET_CONNECT = (
    "gpu1:100:120 [0] transport/net_socket.cc:404 NCCL WARN NET/Socket : Connect to 10.0.0.2<43123> failed : "
    "Connection refused\n"
)
IB_CHANNEL = "gpu1:100:100 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA\n"
BOOTSTRAP_REFUSED = (
    "gpu1:100:130 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.9<5000> failed : "
    "Connection refused\n"
)

# src/bootstrap.cc's own WARN, with a NET/Socket prefix, of the bootstrap's socket (made fatal here by its error).
BOOTSTRAP_NET_SOCKET = (
    "gpu1:100:100 [0] bootstrap.cc:230 NCCL WARN NET/Socket : No usable listening interface found, error 2\n"
)


@pytest.mark.parametrize(
    "log,transport,network",
    [
        (IB_COMPLETION, "ib", "IB"),
        (IB_COMPLETION.replace("transport/net_ib.cc:1296 ", ""), "ib", "IB"),  # the message alone says NET/IB
        (IB_COMPLETION.replace("NET/IB : ", ""), "ib", None),  # the source file alone says net_ib
        (SHM_CHANNELS + SOCKET_CONNECT, "socket", "Socket"),
        (SHM_CHANNELS + SOCKET_CONNECT.replace("NET/Socket : ", ""), "socket", None),
        (SHM_CHANNELS + "gpu1:1:2 [0] misc/ibvwrap.cc:268 NCCL WARN Call to ibv_create_cq failed\n", "ib", None),
        (SHM_CHANNELS + "gpu1:1:2 [0] NCCL WARN Call to ibv_reg_mr failed with error Bad address\n", "ib", None),
        (IB_CHANNEL + BOOTSTRAP_REFUSED, "ib", "IB"),  # misc/socket.cc is the bootstrap's: names no transport
        (SHM_CHANNELS + BOOTSTRAP_REFUSED, "p2p", None),
        (IB_CHANNEL + BOOTSTRAP_NET_SOCKET + BOOTSTRAP_REFUSED, "ib", "IB"),  # bootstrap.cc's "NET/Socket :"
        (IB_CHANNEL + "gpu1:1:3 [1] transport/shm.cc:310 NCCL WARN Cuda failure 'invalid argument'\n", "p2p", "IB"),
        (text(AZURE), "ib", "IB"),
    ],
    ids=[
        "net-ib-completion-alone",
        "net-ib-message-without-file",
        "net_ib.cc-file-without-net-name",
        "net_socket-connect-beside-shm",
        "net_socket.cc-file-beside-shm",
        "ibvwrap-beside-shm",
        "ibv-call-beside-shm",
        "bootstrap-socket-beside-ib",
        "bootstrap-socket-beside-shm",
        "bootstrap-net-socket-warn-beside-ib",
        "shm-failure-beside-ib",
        "azure-fixture",
    ],
)
def test_the_failing_subsystem_names_the_transport(log, transport, network):
    res = classify(log)
    assert res.fatal
    assert res.transport == transport
    if transport != "p2p":
        assert res.network == network
    assert res.evidence or transport == "p2p"
    if classify("".join(line for line in log.splitlines(True) if "WARN" not in line)).transport != transport:
        assert res.evidence[0] in res.errors  # the failure decided: its line is the evidence


def test_a_failure_of_the_carrying_transport_keeps_its_evidence():
    res = classify(IB_CHANNEL + IB_COMPLETION)
    assert res.transport == "ib" and res.network == "IB" and res.evidence == (IB_CHANNEL.strip(),)


def test_a_benign_warn_of_another_subsystem_decides_nothing():
    log = SHM_CHANNELS + "gpu1:1:2 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]\n"
    res = classify(log)
    assert res.transport == "p2p" and not res.fatal


def test_the_first_failure_that_names_a_subsystem_decides():
    first = "gpu1:1:2 [0] enqueue.cc:100 NCCL WARN Cuda failure 'an illegal memory access'\n"
    assert classify(SHM_CHANNELS + first + SOCKET_CONNECT + IB_COMPLETION).transport == "socket"
    assert classify(SHM_CHANNELS + first + IB_COMPLETION + SOCKET_CONNECT).transport == "ib"


# --------------------------------------------------------------------------- rank prefixes


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("name", NAMES)
def test_rank_prefixed_log_decides_as_the_plain_one(name, prefix):
    assert key(classify(prefixed(text(name), prefix))) == key(classify(text(name)))


@pytest.mark.parametrize("prefix", PREFIXES)
def test_rank_prefixed_failing_subsystem(prefix):
    assert key(classify(prefixed(SHM_CHANNELS + SOCKET_CONNECT, prefix))) == key(
        classify(SHM_CHANNELS + SOCKET_CONNECT)
    )
    assert key(classify(prefixed(MIXED_IB_ROCE_P2P, prefix))) == key(classify(MIXED_IB_ROCE_P2P))


# --------------------------------------------------------------------------- fuzz


def mangle(rng: random.Random, sources: list[str]) -> str:
    """Real lines of several logs, shuffled, rank-prefixed, cut mid-line, with junk between."""
    lines = [line for s in rng.sample(sources, rng.randrange(1, 4)) for line in s.splitlines(True)]
    lines += [SOCKET_CONNECT, IB_COMPLETION, BOOTSTRAP_REFUSED, MIXED_IB_ROCE_P2P][: rng.randrange(5)]
    rng.shuffle(lines)
    out = []
    for line in lines:
        op = rng.randrange(8)
        if op == 0:
            line = line[: rng.randrange(len(line) + 1)]  # cut mid-line
        elif op == 1:
            line = rng.choice(PREFIXES) + line
        elif op == 2:
            junk = "".join(chr(rng.randrange(0, 0x3000)) for _ in range(rng.randrange(1, 40)))
            i = rng.randrange(len(line) + 1)
            line = line[:i] + junk + line[i:]
        elif op == 3:
            line = line.replace("\n", rng.choice(["\r\n", "\r", "\x0b", "\x85", "\u2028", ""]))
        elif op == 4:
            line = rng.choice(["NCCL WARN ", "via NET/", "via SHM/", "NET/", " nvls channels", "NCCL INFO "]) + line
        out.append(line)
    return "".join(out)


def test_fuzz_classify_never_raises():
    rng = random.Random(2024)
    sources = [text(n) for n in NAMES]
    for _ in range(3000):
        res = classify(mangle(rng, sources))
        assert res.transport in KINDS
        assert res.fatal is (res.fatal_line > 0)
        json.dumps(cli_parse.transport_dict(res))


def test_fuzz_command_exit_codes(tmp_path, capsys):
    from nodehealth import cli

    rng = random.Random(7)
    sources = [text(n) for n in NAMES]
    path = tmp_path / "nccl.log"
    for i in range(60):
        data = mangle(rng, sources).encode("utf-8", "surrogatepass")
        if i % 5 == 0:
            data = data[: rng.randrange(len(data) + 1)] + bytes(rng.randrange(256) for _ in range(50))
        path.write_bytes(data)
        code = cli.main(["nccl", "transport", str(path), "--format", rng.choice(["json", "text"])])
        captured = capsys.readouterr()
        assert code in (0, 1, 2), captured.err
        assert "internal error" not in captured.err
