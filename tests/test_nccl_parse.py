"""nodehealth.nccl.parse and ``nodehealth nccl parse``: real nccl-tests outputs, exact values; bad input; fuzz."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

from nodehealth.nccl import cli_parse
from nodehealth.nccl.parse import bus_factor, busbw, parse_perf, strip_prefix
from nodehealth.nccl.results import ParseError

FIXTURES = Path(__file__).parent / "fixtures" / "real-world" / "nccl_tests"
EXPECTED = {k: v for k, v in json.loads((FIXTURES / "expected.json").read_text()).items() if not k.startswith("_")}
PARSED = {k: v for k, v in EXPECTED.items() if "parse_error_line" not in v}
FAILING = {k: v for k, v in EXPECTED.items() if "parse_error_line" in v}


def text(name: str) -> str:
    return (FIXTURES / EXPECTED[name]["file"]).read_text(encoding="utf-8")


# --------------------------------------------------------------------------- every fixture, exactly


def test_every_fixture_file_has_an_expected_entry():
    files = {p.name for p in FIXTURES.glob("*.txt")}
    assert files == {v["file"] for v in EXPECTED.values()}


@pytest.mark.parametrize("name", sorted(PARSED))
def test_fixture_values_exact(name):
    exp = EXPECTED[name]
    res = parse_perf(text(name))
    assert res.avg_busbw_gbps == exp["avg_busbw_gbps"]
    assert res.wrong == exp["wrong_total"]
    assert len(res.rows) == exp["num_size_rows"]
    assert res.ranks == exp["ranks"]
    assert res.nccl_version == exp.get("nccl_version")
    largest = res.largest
    assert largest is not None
    assert largest.size_bytes == exp["largest_size_bytes"]
    assert largest.oop_busbw_gbps == exp["largest_size_oop_busbw_gbps"]
    assert largest.ip_busbw_gbps == exp["largest_size_inplace_busbw_gbps"]
    for key, attr in (
        ("largest_size_oop_time_us", "oop_time_us"),
        ("largest_size_inplace_time_us", "ip_time_us"),
        ("largest_size_oop_algbw_gbps", "oop_algbw_gbps"),
        ("largest_size_inplace_algbw_gbps", "ip_algbw_gbps"),
        ("largest_type", "type"),
        ("largest_redop", "redop"),
        ("largest_oop_wrong", "oop_wrong"),
    ):
        if key in exp:
            assert getattr(largest, attr) == exp[key], key
    if "complete" in exp:
        assert res.complete is exp["complete"]
    if "devices" in exp:
        assert list(res.devices) == exp["devices"]
    if "num_warnings" in exp:
        assert len(res.warnings) == exp["num_warnings"]
    # the header says which program only from 2022 on ("# Collective test starting: ...")
    if res.collective is not None:
        assert res.collective == exp["collective"]


@pytest.mark.parametrize("name", sorted(FAILING))
def test_fixtures_without_a_complete_row_name_the_line(name):
    with pytest.raises(ParseError) as info:
        parse_perf(text(name))
    assert info.value.line == EXPECTED[name]["parse_error_line"]
    assert f"line {info.value.line}" in str(info.value)


@pytest.mark.parametrize("name", sorted(PARSED))
def test_busbw_recomputed_from_algbw_within_rounding(name):
    """nccl-tests prints algbw and busbw with two decimals: busbw(algbw) agrees within the rounding of algbw."""
    exp = EXPECTED[name]
    res = parse_perf(text(name))
    n = exp["ranks"]
    collective = exp.get("bus_factor_collective", "all_reduce")
    factor = bus_factor(n, collective)
    checked = 0
    for row in res.rows:
        for alg, bus in ((row.oop_algbw_gbps, row.oop_busbw_gbps), (row.ip_algbw_gbps, row.ip_busbw_gbps)):
            assert alg is not None and bus is not None
            tol = 0.005 * factor + 0.005 + 1e-9
            assert abs(busbw(alg, n, collective) - bus) <= tol, (row.size_bytes, alg, bus)
            checked += 1
    assert checked == 2 * len(res.rows)


def test_gcm_rows_in_order_with_every_column():
    res = parse_perf(text("gcm_single_node_8xA100"))
    first = res.rows[0]
    assert (first.size_bytes, first.count, first.type, first.redop) == (33554432, 8388608, "float", "sum")
    assert (first.oop_time_us, first.oop_algbw_gbps, first.oop_busbw_gbps, first.oop_wrong) == (344.8, 97.32, 170.31, 0)
    assert (first.ip_time_us, first.ip_algbw_gbps, first.ip_busbw_gbps, first.ip_wrong) == (349.5, 95.99, 167.99, 0)
    assert [r.size_bytes for r in res.rows] == [33554432 << i for i in range(6)]
    assert res.complete and res.skipped_lines == () and res.warnings == ()


def test_old_format_error_column_is_not_a_count_and_na_is_none():
    res = parse_perf(text("nccl_tests_82_broadcast_2xV100_socket_old_format"))
    row = res.rows[0]
    assert row.oop_wrong is None and row.ip_wrong is None
    assert all("Failed to open libibverbs" in w for w in res.warnings)


# --------------------------------------------------------------------------- busbw


@pytest.mark.parametrize(
    "collective,n,factor",
    [
        ("all_reduce", 8, 1.75),
        ("all_reduce_perf", 16, 1.875),
        ("allreduce", 1, 0.0),
        ("all_gather", 8, 0.875),
        ("reduce_scatter", 4, 0.75),
        ("alltoall", 2, 0.5),
        ("broadcast", 8, 1.0),
        ("reduce", 8, 1.0),
        ("sendrecv", 2, 1.0),
    ],
)
def test_bus_factors_are_nccl_tests(collective, n, factor):
    assert bus_factor(n, collective) == pytest.approx(factor)
    assert busbw(100.0, n, collective) == pytest.approx(100.0 * factor)


def test_busbw_refuses_unknown_collective_and_no_ranks():
    with pytest.raises(ValueError):
        busbw(1.0, 8, "allfoo")
    with pytest.raises(ValueError):
        busbw(1.0, 0)


# --------------------------------------------------------------------------- formats the fixtures lack


HEADER_2022 = (
    "#                                                              out-of-place                       in-place\n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    "     time   algbw   busbw #wrong\n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n"
)
ROW_GCM = (
    "  1073741824     268435456     float     sum      -1   8109.1  132.41  231.72      0"
    "   8109.7  132.40  231.70      0"
)


def test_na_wrong_and_min_bw_verdict():
    # writeBenchmarkLineBody with -c 0 prints "N/A"; writeResultFooter adds OK/FAILED with NCCL_TESTS_MIN_BW
    out = (
        HEADER_2022
        + ROW_GCM.replace("      0   8109.7", "    N/A   8109.7")[:-7]
        + "    N/A\n"
        + "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 231.71 FAILED\n"
    )
    res = parse_perf(out)
    assert res.rows[0].oop_wrong is None and res.rows[0].ip_wrong is None
    assert res.avg_busbw_verdict == "FAILED" and res.avg_busbw_gbps == 231.71


def test_newer_header_lines_and_prefixes():
    out = (
        "# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807\n"
        "# Collective test starting: all_reduce_perf\n"
        + HEADER_2022
        + "[1,0]<stdout>:"
        + ROW_GCM
        + "\n"
        + "0: "
        + ROW_GCM.replace("1073741824     268435456", "2147483648     536870912")
        + "\n"
        + "2025-01-01T10:00:00.123456Z "
        + ROW_GCM.replace("1073741824     268435456", "16  4")
        + "\n"
        + "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 1\n"
    )
    res = parse_perf(out)
    assert res.tests_version == "2.17.6" and res.collective == "all_reduce_perf"
    assert [r.size_bytes for r in res.rows] == [1073741824, 2147483648, 16]
    assert res.largest is not None and res.largest.size_bytes == 2147483648


def test_per_iteration_columns_and_timestamp():
    header = (
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max"
        "    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv% timestamp\n"
    )
    row = (
        "    33554432       8388608     float     sum      -1    344.8   97.32  170.31       0    340.1    350.2"
        "    349.9     0.70    349.5   95.99  167.99       0    345.0    355.1    354.0     0.80"
        " 2025-10-28 12:00:00\n"
    )
    res = parse_perf(header + row)
    r = res.rows[0]
    got = (r.oop_time_us, r.oop_busbw_gbps, r.oop_wrong, r.ip_time_us, r.ip_busbw_gbps)
    assert got == (344.8, 170.31, 0, 349.5, 167.99)


def test_2017_layout_times_in_milliseconds():
    header = (
        "#      bytes             N    type      op     time  algbw  busbw      res     time  algbw  busbw      res\n"
    )
    row = "    33554432       8388608   float     sum    0.345  97.32 170.31    0e+00    0.350  95.99 167.99    0e+00\n"
    r = parse_perf(header + row + " Out of bounds values : 0 OK\n Avg bus bandwidth    : 169.15 \n").rows[0]
    assert r.oop_time_us == pytest.approx(345.0) and r.ip_time_us == pytest.approx(350.0)
    assert r.oop_wrong is None


def test_getfloatstr_exponents_and_large_wrong_counts():
    row = ROW_GCM.replace("8109.1", "1.2e+07").replace("      0   8109.7", "  1e+06   8109.7")
    r = parse_perf(HEADER_2022 + row + "\n").rows[0]
    assert r.oop_time_us == 1.2e7 and r.oop_wrong == 1000000
    assert parse_perf(HEADER_2022 + row + "\n").wrong == 1000000


def test_rows_without_a_header_get_the_default_layout():
    res = parse_perf(ROW_GCM + "\n")
    assert res.rows[0].oop_busbw_gbps == 231.72 and res.rows[0].ip_busbw_gbps == 231.70


# --------------------------------------------------------------------------- -J JSON (nccl-tests src/util.cu)


def _json_doc(**over):
    """A document with the keys and nesting the -J writer emits (JSON_FILE_VERSION 3), values of gcm's last row."""
    doc = {
        "version": 3,
        "start_time": "2025-10-20 10:00:00",
        "args": ["./build/all_reduce_perf", "-J", "x.json"],
        "env": [],
        "nccl_version": 22807,
        "config": {
            "nthreads": 1,
            "ngpus": 1,
            "minimum_bytes": 1073741824,
            "maximum_bytes": 1073741824,
            "step_factor": 2,
            "devices": [
                {
                    "rank": i,
                    "group": 0,
                    "pid": 1,
                    "hostname": "h",
                    "device": i,
                    "device_hex": "0000:07:00",
                    "device_info": "NVIDIA A100-SXM4-80GB",
                }
                for i in range(8)
            ],
        },
        "results": [
            {
                "size": 1073741824,
                "count": 268435456,
                "type": "float",
                "redop": "sum",
                "root": "    -1",
                "out_of_place": {"time": 8109.1, "alg_bw": 132.41, "bus_bw": 231.72, "nwrong": 0.0},
                "in_place": {"time": 8109.7, "alg_bw": 132.40, "bus_bw": 231.70, "nwrong": 0.0},
                "actual_iterations": 20,
                "experiment_name": "",
            }
        ],
        "out_of_bounds": {"count": 0, "okay": "true"},
        "average_bus_bandwidth": {"bandwidth": 231.71, "okay": "unchecked"},
        "errors": [],
        "end_time": "2025-10-20 10:00:05",
    }
    doc.update(over)
    return doc


def test_json_output():
    res = parse_perf(json.dumps(_json_doc()))
    assert res.avg_busbw_gbps == 231.71 and res.wrong == 0 and res.ranks == 8
    assert res.nccl_version == "2.28.7" and res.collective == "all_reduce_perf"
    r = res.rows[0]
    assert (r.size_bytes, r.oop_busbw_gbps, r.ip_busbw_gbps, r.oop_wrong) == (1073741824, 231.72, 231.70, 0)


def test_json_with_bare_inf_nan_string_and_null_nwrong():
    doc = json.dumps(_json_doc()).replace('"alg_bw": 132.41', '"alg_bw": inf')
    doc = doc.replace('"nwrong": 0.0', '"nwrong": null', 1)
    doc = doc.replace('"bandwidth": 231.71', '"bandwidth": "nan"')
    res = parse_perf(doc)
    assert res.rows[0].oop_algbw_gbps == float("inf") and res.rows[0].oop_wrong is None
    assert res.avg_busbw_gbps != res.avg_busbw_gbps  # NaN


def test_truncated_json_names_its_line():
    doc = json.dumps(_json_doc(), indent=1)
    with pytest.raises(ParseError) as info:
        parse_perf(doc[: len(doc) // 2])
    assert info.value.line > 1


def test_json_without_results():
    with pytest.raises(ParseError):
        parse_perf('{"version": 3}')


# --------------------------------------------------------------------------- bad input


def test_empty_and_blank_input():
    for t in ("", "\n\n   \n"):
        with pytest.raises(ParseError) as info:
            parse_perf(t)
        assert info.value.line == 0


def test_no_table_at_all():
    with pytest.raises(ParseError):
        parse_perf("hello\nworld\n")


def test_failed_run_names_the_failure_line():
    out = (
        "# nThread 1 nGpus 8 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1\n"
        "node1: Test NCCL failure common.cu:1005 'unhandled system error (run with NCCL_DEBUG=INFO for details)'\n"
    )
    with pytest.raises(ParseError) as info:
        parse_perf(out)
    assert info.value.line == 2


def test_truncated_mid_row_keeps_the_complete_rows():
    full = text("gcm_single_node_8xA100")
    cut = full[: full.index("  1073741824") + 40]
    res = parse_perf(cut)
    assert len(res.rows) == 5 and res.skipped_lines == (len(cut.splitlines()),)
    assert not res.complete and res.avg_busbw_gbps is None


def test_interleaved_rank_lines():
    lines = text("gcm_pairwise_2node_16xA100").splitlines()
    noisy = []
    for i, line in enumerate(lines):
        noisy.append(line)
        noisy.append(f"host2:{7000 + i}:{7100 + i} [{i % 8}] NCCL INFO Channel 00/0 : 9[1] -> 8[0] via P2P/IPC")
        if i % 5 == 0:
            noisy.append(f"host2:{7000 + i}:{7100 + i} [3] transport/net.cc:1134 NCCL WARN something")
    # another process's output written into the middle of a row
    k = next(i for i, line in enumerate(noisy) if line.startswith("   268435456"))
    noisy[k] = noisy[k][:50] + "host2:1:1 [0] NCCL INFO Connected all rings"
    res = parse_perf("\n".join(noisy) + "\n")
    assert len(res.rows) == 5 and res.skipped_lines == (k + 1,)
    assert res.avg_busbw_gbps == 150.209 and res.ranks == 16
    assert any("NCCL WARN" in w for w in res.warnings)


def test_non_utf8_bytes_decoded_with_replacement():
    raw = text("oci_1node_8xA100_10GiB").encode() + b"\xff\xfe garbage \xc3\n"
    res = parse_perf(raw.decode("utf-8", errors="replace"))
    assert res.avg_busbw_gbps == 232.167


def test_fifty_megabytes_parse():
    one = text("gcp_a3mega_2node_16xH100")
    big = one * (50_000_000 // len(one) + 1)
    res = parse_perf(big)
    assert res.tables == big.count("#       size")
    assert len(res.rows) == 31 * res.tables and res.avg_busbw_gbps == 70.742


def test_strip_prefix():
    assert strip_prefix("[1,0]<stdout>:# x") == "# x"
    assert strip_prefix("[rank3]: 0: 2024-01-01T00:00:00Z hello") == "hello"
    assert strip_prefix("node1:123:456 [0] NCCL INFO") == "node1:123:456 [0] NCCL INFO"


# --------------------------------------------------------------------------- fuzz


def _mutate(rng: random.Random, s: str) -> str:
    op = rng.randrange(8)
    if not s:
        return s
    i = rng.randrange(len(s))
    if op == 0:
        return s[:i]  # truncation
    if op == 1:
        return s[:i] + s[i + rng.randrange(1, 200) :]  # deletion
    if op == 2:
        return s[:i] + "".join(chr(rng.randrange(0, 0x3000)) for _ in range(rng.randrange(1, 20))) + s[i:]
    if op == 3:
        lines = s.splitlines(True)
        rng.shuffle(lines)
        return "".join(lines)
    if op == 4:
        junk = ["N/A", "nan", "-inf", "1e999", "#", "\x00", "\r", "{", "-1", "99999999999999999999"]
        return s[:i] + rng.choice(junk) + s[i:]
    if op == 5:
        lines = s.splitlines(True)
        j = rng.randrange(len(lines))
        return "".join(lines[:j] + lines[j : j + 1] * rng.randrange(2, 5) + lines[j + 1 :])
    if op == 6:
        return s.replace(" ", rng.choice(["\t", "  ", ""]), rng.randrange(1, 50))
    return json.dumps(_json_doc())[: rng.randrange(1, 2000)]


def test_fuzz_only_parse_error_escapes():
    rng = random.Random(1234)
    sources = [text(n) for n in EXPECTED]
    for _ in range(2000):
        s = rng.choice(sources)
        for _ in range(rng.randrange(1, 4)):
            s = _mutate(rng, s)
        try:
            res = parse_perf(s)
        except ParseError as e:
            assert isinstance(e.line, int) and e.line >= 0
            continue
        assert res.rows
        json.dumps(cli_parse.perf_dict(res))  # the command can always print it


# --------------------------------------------------------------------------- the command


def run(argv, stdin=b""):
    out, err = io.StringIO(), io.StringIO()
    code = cli_parse.main(argv, out=out, err=err, stdin=io.BytesIO(stdin))
    return code, out.getvalue(), err.getvalue()


# a row's keys in the JSON document, pinned here apart from cli_parse.ROW_KEYS: the size columns, then
# time, algbw and busbw out of place and in place
KEYS = {"size_bytes", "count", "type", "redop"} | {
    f"{place}_{column}" for place in ("oop", "ip") for column in ("time_us", "algbw_gbps", "busbw_gbps")
}


def test_command_json_document():
    code, out, err = run(["parse", str(FIXTURES / "gcm_single_node_8xA100.txt"), "--format", "json"])
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert doc["avg_busbw_gbps"] == 210.99 and doc["wrong"] == 0
    assert KEYS <= set(doc["rows"][0]) and KEYS <= set(doc["largest"])
    assert doc["largest"]["size_bytes"] == 1073741824 and doc["largest"]["oop_busbw_gbps"] == 231.72
    assert len(doc["rows"]) == 6


def test_command_stdin_and_text():
    code, out, _ = run(["parse", "-"], stdin=(FIXTURES / "oci_2node_16xA100_10GiB.txt").read_bytes())
    assert code == 0 and "57.0188" in out


def test_command_cannot_parse_is_one_line_exit_2():
    code, out, err = run(["parse", str(FIXTURES / "nccl_tests_249_1xA10G_hash_stripped_truncated_row.txt")])
    assert code == 2 and out == "" and err.count("\n") == 1 and "line 11" in err and "Traceback" not in err


def test_command_missing_file_and_usage():
    code, _, err = run(["parse", "/nonexistent/x.txt"])
    assert code == 2 and err.count("\n") == 1
    code, _, err = run(["parse"])
    assert code == 2 and "Traceback" not in err
    code, _, _ = run(["parse", "-", "--format", "yaml"])
    assert code == 2


def test_command_refuses_more_than_the_limit():
    with pytest.raises(cli_parse.InputError):
        cli_parse.read_input("-", io.BytesIO(b"x" * 2000), limit=1000)
    assert cli_parse.read_input("-", io.BytesIO(b"ab\xffc"), limit=1000) == "ab\ufffdc"


def test_command_non_utf8_file(tmp_path):
    p = tmp_path / "x.txt"
    p.write_bytes((FIXTURES / "gcm_single_node_8xA100.txt").read_bytes().replace(b"{hostname}", b"\xff\xfe"))
    code, out, _ = run(["parse", str(p), "--format", "json"])
    assert code == 0 and json.loads(out)["avg_busbw_gbps"] == 210.99


def test_rows_built_in_place_equal_the_dataclass():
    from nodehealth.nccl.perf_table import new_row as _new_row
    from nodehealth.nccl.results import PerfRow

    values = (8, 2, "float", "sum", 1.0, 2.0, 3.0, 0, 4.0, 5.0, 6.0, 1)
    row = _new_row(values)
    assert row == PerfRow(*values) and hash(row) == hash(PerfRow(*values)) and repr(row) == repr(PerfRow(*values))
    with pytest.raises(AttributeError):
        row.size_bytes = 1  # type: ignore[misc]
