"""Read the ``-J FILE.json`` document of NVIDIA's nccl-tests (src/util.cu, ``JSON_FILE_VERSION 3``).

``results[]`` of ``size``, ``count``, ``type``, ``redop``, ``root`` and ``out_of_place`` /
``in_place`` objects of ``time`` (or ``cpu_time``), ``alg_bw``, ``bus_bw``, ``nwrong``;
``out_of_bounds.count``, ``average_bus_bandwidth.bandwidth``, ``config.devices[]``,
``nccl_version`` as a version code, ``errors[]``. The writer prints doubles with ``%lf``, so an
infinite value comes out as the bare word ``inf`` (not JSON); NaN comes out as the string
``"nan"``. ``nccl.parse.parse_perf`` hands a document that starts with ``{`` here; the text
output is its own.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Optional

from nodehealth.nccl.results import ParseError, PerfResult, PerfRow

MAX_WARNINGS = 200  # lines kept in ``warnings`` (the text parser's and the document's ``errors[]``)

_BARE_RE = re.compile(r"(?<=[:\[,])(\s*)(-?)(inf|nan)\b", re.IGNORECASE)


def _version_code(code: Any) -> Optional[str]:
    """NCCL_VERSION_CODE as text: 2.9 on ``X*10000 + Y*100 + Z``, before ``X*1000 + Y*100 + Z``."""
    if isinstance(code, bool) or not isinstance(code, int) or code <= 0:
        return None
    if code >= 20900:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _jnum(value: Any) -> Optional[float]:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _jside(obj: Any) -> tuple[Optional[float], Optional[float], Optional[float], Optional[int]]:
    if not isinstance(obj, dict):
        return None, None, None, None
    t = _jnum(obj.get("time", obj.get("cpu_time")))
    w = _jnum(obj.get("nwrong"))
    wrong = int(w) if w is not None and math.isfinite(w) else None
    return t, _jnum(obj.get("alg_bw")), _jnum(obj.get("bus_bw")), wrong


def parse_json(text: str) -> PerfResult:
    """The ``-J`` document in ``text``; ``ParseError`` when it does not parse or holds no result row."""
    try:
        doc = json.loads(text)
    except ValueError as err:
        try:
            doc = json.loads(
                _BARE_RE.sub(
                    lambda m: (
                        m.group(1) + ("-Infinity" if m.group(2) else "Infinity")
                        if m.group(3).lower() == "inf"
                        else m.group(1) + "NaN"
                    ),
                    text,
                )
            )
        except ValueError:
            line = getattr(err, "lineno", 0)
            msg = getattr(err, "msg", str(err))
            col = getattr(err, "colno", 0)
            raise ParseError(f"nccl-tests JSON does not parse: {msg} (column {col}; truncated file?)", line) from None
    except RecursionError:
        raise ParseError("nccl-tests JSON nests too deeply", 1) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise ParseError("JSON without a 'results' list: not nccl-tests -J output", 1)
    rows: list[PerfRow] = []
    for res in doc["results"]:
        if not isinstance(res, dict):
            continue
        size, count = res.get("size"), res.get("count")
        if (
            isinstance(size, bool)
            or not isinstance(size, int)
            or isinstance(count, bool)
            or not isinstance(count, int)
            or size < 0
            or count < 0
        ):
            continue
        o = _jside(res.get("out_of_place"))
        p = _jside(res.get("in_place"))
        rows.append(
            PerfRow(
                size_bytes=size,
                count=count,
                type=str(res.get("type", "")),
                redop=str(res.get("redop", "")),
                oop_time_us=o[0],
                oop_algbw_gbps=o[1],
                oop_busbw_gbps=o[2],
                oop_wrong=o[3],
                ip_time_us=p[0],
                ip_algbw_gbps=p[1],
                ip_busbw_gbps=p[2],
                ip_wrong=p[3],
            )
        )
    if not rows:
        raise ParseError("nccl-tests JSON has no result rows", 1)
    avg_obj = doc.get("average_bus_bandwidth")
    avg = _jnum(avg_obj.get("bandwidth")) if isinstance(avg_obj, dict) else None
    verdict = avg_obj.get("okay") if isinstance(avg_obj, dict) else None
    oob_obj = doc.get("out_of_bounds")
    oob = oob_obj.get("count") if isinstance(oob_obj, dict) else None
    row_wrong = sum((r.oop_wrong or 0) + (r.ip_wrong or 0) for r in rows)
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    devices = [d for d in (config.get("devices") or []) if isinstance(d, dict)] if isinstance(config, dict) else []
    args = doc.get("args")
    collective = None
    if isinstance(args, list) and args and isinstance(args[0], str):
        collective = args[0].rsplit("/", 1)[-1] or None
    errors = doc.get("errors")
    warnings = tuple(str(e)[:500] for e in errors[:MAX_WARNINGS]) if isinstance(errors, list) else ()
    return PerfResult(
        rows=tuple(rows),
        avg_busbw_gbps=avg,
        wrong=oob if isinstance(oob, int) and not isinstance(oob, bool) else row_wrong,
        collective=collective,
        nccl_version=_version_code(doc.get("nccl_version")),
        ranks=len(devices) or None,
        warnings=warnings,
        devices=tuple(str(d.get("device_info", "")) for d in devices),
        avg_busbw_verdict={"true": "OK", "false": "FAILED"}.get(str(verdict).lower()) if verdict is not None else None,
        complete=avg is not None,
    )
