"""What earlier rounds saw of each InfiniBand port: the state history behind flap detection and the
error counters' increase over a window (``checks.host_infiniband``).

A port's history is a change log: a sample (``IbSample``: time, up, counters) is kept when the port's
``up`` or any counter differs from the sample before it, and this round's sample is always last. So a
daemon that looks every 30 s keeps a few samples a day on a quiet port, and a quiet round rewrites
nothing (the file holds the changes; the last sample only moves the time). Kept in memory by the caller
for one run and in the state dir (``ib-history.json``, this boot's: a reboot starts afresh) between
runs; every face and the daemon add their round. Bounded: samples older than ``HORIZON_S`` go (the
newest of them stays, as the baseline at the horizon), at most ``MAX_SAMPLES`` per port and
``MAX_PORTS`` ports; a file the strict reader refuses (too big, not JSON, another shape) is history
lost, never an error of the port: the check then sees only this round.

Pure functions over values, plus ``update`` (the one writer, under the file's lock, atomically) and
``read`` (a look: nothing written).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Sequence

from nodehealth.observations import IbPort, IbSample
from nodehealth.statedir import files, layout

HORIZON_S = 86400.0  # the longest window a setting may ask for (host_infiniband's *_window_s max)
MAX_SAMPLES = 256  # per port: a port flapping every round for a day keeps its newest changes
MAX_PORTS = 256  # host_infiniband's min_ports max
MAX_COUNTER = (1 << 64) - 1  # the kernel prints a u64 ("%llu")
FORMAT = 1


def key(port: IbPort) -> str:
    return f"{port.device}/{port.port}"


def sample_of(port: IbPort, now: float) -> IbSample:
    return IbSample(now, port.state == "ACTIVE" and port.phys_state == "LinkUp", port.counters)


def merge(earlier: Sequence[IbSample], now: IbSample) -> tuple[IbSample, ...]:
    """``earlier`` (oldest first) with ``now`` added last: the last earlier sample is replaced when it
    says the same (only its time moves), samples past the horizon go but the newest of them, and at
    most ``MAX_SAMPLES`` stay. A sample from the future (the clock was set back) ends the history."""
    kept = [s for s in earlier if s.t <= now.t]
    if len(kept) != len(earlier):
        kept = []
    if kept and (kept[-1].up, kept[-1].counters) == (now.up, now.counters) and len(kept) > 1:
        # The same as before: the change log keeps the first sample of a run of equal ones and the latest.
        if (kept[-2].up, kept[-2].counters) == (now.up, now.counters):
            kept.pop()
    kept.append(now)
    old = [i for i, s in enumerate(kept) if s.t < now.t - HORIZON_S]
    if len(old) > 1:
        kept = kept[old[-1] :]
    return tuple(kept[-MAX_SAMPLES:])


def encode(history: dict[str, tuple[IbSample, ...]]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "ports": {k: [[s.t, s.up, [list(c) for c in s.counters]] for s in v] for k, v in sorted(history.items())},
    }


def decode(raw: Any) -> dict[str, tuple[IbSample, ...]]:
    """The file's value back; anything of another shape is dropped (that port's history, or all)."""
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or not isinstance(raw.get("ports"), dict):
        return {}
    out: dict[str, tuple[IbSample, ...]] = {}
    for name, samples in list(raw["ports"].items())[:MAX_PORTS]:
        parsed = _samples(samples)
        if isinstance(name, str) and len(name) <= 128 and parsed is not None:
            out[name] = parsed
    return out


def _samples(raw: Any) -> Optional[tuple[IbSample, ...]]:
    if not isinstance(raw, list) or len(raw) > MAX_SAMPLES:
        return None
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[1], bool)):
            return None
        t, up, counters = item
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            return None
        pairs = _counters(counters)
        if pairs is None:
            return None
        out.append(IbSample(float(t), up, pairs))
    if any(b.t < a.t for a, b in zip(out, out[1:])):
        return None
    return tuple(out)


def _counters(raw: Any) -> Optional[tuple[tuple[str, int], ...]]:
    if not isinstance(raw, list) or len(raw) > 64:
        return None
    pairs = []
    for pair in raw:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
            return None
        name, value = pair
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNTER:
            return None
        pairs.append((name, value))
    return tuple(pairs)


def attach(
    ports: Sequence[IbPort], earlier: dict[str, tuple[IbSample, ...]], now: float
) -> tuple[tuple[IbPort, ...], dict[str, tuple[IbSample, ...]]]:
    """Each port with its history (this round's sample last), and the history to keep: the ports seen
    now (a port gone from sysfs is forgotten: the check judges what is there)."""
    history = {key(p): merge(earlier.get(key(p), ()), sample_of(p, now)) for p in ports[:MAX_PORTS]}
    return tuple(dataclasses.replace(p, history=history.get(key(p), ())) for p in ports), history


def stored(history: dict[str, tuple[IbSample, ...]]) -> dict[str, tuple[IbSample, ...]]:
    """What the file keeps: each port's change log without its last sample when that one says what the
    one before it says (it only moves the time, and this round's sample is added to every read)."""
    return {k: v[:-1] if len(v) > 1 and _same(v[-1], v[-2]) else v for k, v in history.items()}


def _same(a: IbSample, b: IbSample) -> bool:
    return (a.up, a.counters) == (b.up, b.counters)


def fit(history: dict[str, tuple[IbSample, ...]], limit: int = files.MAX_READ // 2) -> dict[str, tuple[IbSample, ...]]:
    """``history`` cut to what its file may hold (the reader's limit, halved for headroom): each port's
    oldest samples go first, half at a time, so many ports flapping all day still leave a file the
    next round reads (a file over the limit would be refused and never rewritten)."""
    import json

    # A sample's JSON is at most 32 bytes and 64 a counter (the longest name with a u64): the common
    # case (a quiet node) is sure to fit without encoding it once more.
    bound = sum(len(k) + 8 + sum(32 + 64 * len(s.counters) for s in v) for k, v in history.items())
    if bound <= limit:
        return history
    while len(json.dumps(encode(history))) > limit and any(len(v) > 1 for v in history.values()):
        history = {k: v[len(v) // 2 :] if len(v) > 1 else v for k, v in history.items()}
    return history


def read(paths: Any) -> dict[str, tuple[IbSample, ...]]:
    """The kept history, for a run that writes nothing; {} when there is none or it is unusable.
    ``paths``: the config's ``[paths]`` (or one directory, as ``layout.path_for`` takes it)."""
    raw, _why = files.read_json_checked(layout.path_for(paths, layout.IB_HISTORY))
    return decode(raw)


def update(paths: Any, ports: Sequence[IbPort], now: float, lock_timeout_s: float = 1.0) -> tuple[IbPort, ...]:
    """Add this round to the kept history (under its lock, written atomically) and return the ports
    with theirs. A state dir that cannot be written (unsafe, full, read-only) costs the history, not
    the round: the ports come back with what could be read."""
    seen: dict[str, tuple[IbPort, ...]] = {}
    earlier = read(paths)
    out, history = attach(ports, earlier, now)
    if stored(history) == earlier:
        return out  # a quiet round: nothing new to keep, the file is not rewritten

    def change(raw: Any) -> dict[str, tuple[IbSample, ...]]:
        out, history = attach(ports, decode(raw), now)
        seen["ports"] = out
        return fit(stored(history))

    try:
        files.require_state_dir(layout.dir_for(paths, layout.IB_HISTORY))
        files.update_json(layout.path_for(paths, layout.IB_HISTORY), change, lock_timeout_s, encode=encode)
    except OSError:
        if "ports" not in seen:
            seen["ports"] = attach(ports, read(paths), now)[0]
    return seen["ports"]
