"""Helper for tests/test_journald.py, run as root under ``unshare -m``: in this private mount namespace,
a tmpfs over /run/systemd (or /run) puts a datagram socket where libsystemd's sd_journal_sendv sends, at
/run/systemd/journal/socket; runs the command given and prints, as JSON, every entry received, each as
{field: value} decoded from journald's native protocol. The host's /run is not touched.

  unshare -m python3 tests/journal_ns.py -- CMD...
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys


def decode(datagram: bytes) -> dict[str, str]:
    """journald's native protocol: ``KEY=value\\n``, or ``KEY\\n`` + 64-bit LE length + value + ``\\n``."""
    fields: dict[str, str] = {}
    i = 0
    while i < len(datagram):
        nl = datagram.index(b"\n", i)
        line = datagram[i:nl]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            i = nl + 1
        else:
            key = line
            size = int.from_bytes(datagram[nl + 1 : nl + 9], "little")
            value = datagram[nl + 9 : nl + 9 + size]
            i = nl + 9 + size + 1
        fields[key.decode()] = value.decode("utf-8", "replace")
    return fields


def main() -> int:
    cmd = sys.argv[sys.argv.index("--") + 1 :]
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    over = "/run/systemd" if os.path.isdir("/run/systemd") else "/run"
    subprocess.run(["mount", "-t", "tmpfs", "nodehealth-test", over], check=True)
    os.makedirs("/run/systemd/journal", exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("/run/systemd/journal/socket")
    run = subprocess.run(cmd, capture_output=True, text=True)
    sock.setblocking(False)
    entries = []
    while True:
        try:
            entries.append(decode(sock.recv(1 << 20)))
        except BlockingIOError:
            break
    print(json.dumps({"rc": run.returncode, "stdout": run.stdout, "stderr": run.stderr, "entries": entries}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
