"""Trace files: CSV and libCacheSim oracleGeneral round trips, and errors that say where."""

import re

import numpy as np
import pytest
import zstandard

from loadgen.traces.trace import (
    ORACLE_DTYPE,
    Trace,
    TraceError,
    next_access,
    read_trace,
    write_trace,
)
from loadgen.traces.workload import WorkloadSpec, generate


@pytest.fixture
def trace() -> Trace:
    return generate(WorkloadSpec(objects=500, requests=3000, one_hit_share=0.3, seed=7))


def same(a: Trace, b: Trace) -> bool:
    return (
        a.key_strings() == b.key_strings()
        and np.array_equal(a.sizes, b.sizes)
        and np.allclose(a.times, b.times, rtol=0, atol=1e-9)
    )


def test_csv_round_trip_keeps_every_request(trace, tmp_path):
    path = tmp_path / "t.csv"
    write_trace(trace, path)
    assert path.read_text().splitlines()[0] == "time,key,size"
    assert same(read_trace(path), trace)


def test_oracle_general_round_trip_with_whole_second_times(trace, tmp_path):
    whole = Trace(np.floor(trace.times), trace.ids, trace.sizes)
    path = tmp_path / "t.oracleGeneral.bin"
    write_trace(whole, path)
    assert path.stat().st_size == 24 * len(trace)
    back = read_trace(path)
    assert same(back, whole)
    # A CSV-sourced trace with numeric keys writes the same binary.
    csv_path = tmp_path / "t.csv"
    write_trace(whole, csv_path)
    write_trace(read_trace(csv_path), tmp_path / "again.bin")
    assert (tmp_path / "again.bin").read_bytes() == path.read_bytes()


def test_oracle_records_carry_next_access_index(tmp_path):
    t = Trace(np.zeros(5), np.array([7, 8, 7, 9, 8]), np.ones(5, dtype=np.int64))
    write_trace(t, tmp_path / "n.bin")
    records = np.fromfile(tmp_path / "n.bin", dtype=ORACLE_DTYPE)
    assert records["next"].tolist() == [2, 4, -1, -1, -1]
    assert next_access(np.array([1, 1, 1])).tolist() == [1, 2, -1]


def test_truncated_binary_record_names_its_offset(tmp_path):
    path = tmp_path / "bad.bin"
    path.write_bytes(b"\0" * 50)
    with pytest.raises(TraceError, match="byte offset 48"):
        read_trace(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("t,k,s\n1,a,2\n", r":1: expected the header"),
        ("time,key,size\n1,a,2\n2,b,lots\n", r":3: size 'lots' is not an integer"),
        ("time,key,size\n1,a,2\nsoon,b,3\n", r":3: time 'soon' is not a number"),
        ("time,key,size\n1,a\n", r":2: expected 3 fields"),
        ("time,key,size\n1,a,-4\n", r":2: size -4 is negative"),
        ("time,key,size\n1,,4\n", r":2: empty key"),
        ("", r":1: expected the header"),
    ],
)
def test_malformed_csv_names_the_line(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_string_keys_cannot_be_written_as_oracle_general(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("time,key,size\n0,/index.html,10\n")
    with pytest.raises(TraceError, match=r"write it as \.csv"):
        write_trace(read_trace(path), tmp_path / "s.bin")


def test_distinct_bytes_counts_each_object_once_at_its_largest_size():
    t = Trace(np.zeros(4), np.array([1, 2, 1, 1]), np.array([10, 5, 30, 20]))
    assert t.distinct_bytes() == 35 and t.distinct_objects() == 2


def test_zstd_compressed_traces_read_as_they_are(trace, tmp_path):
    whole = Trace(np.floor(trace.times), trace.ids, trace.sizes)
    for name in ("t.oracleGeneral.bin", "t.csv"):
        plain = tmp_path / name
        write_trace(whole, plain)
        packed = tmp_path / f"{name}.zst"
        packed.write_bytes(zstandard.ZstdCompressor().compress(plain.read_bytes()))
        assert same(read_trace(packed), whole)


def test_a_cut_zstd_trace_names_how_far_it_got(trace, tmp_path):
    plain = tmp_path / "t.oracleGeneral.bin"
    write_trace(trace, plain)
    packed = zstandard.ZstdCompressor().compress(plain.read_bytes())
    cut = tmp_path / "cut.oracleGeneral.bin.zst"
    cut.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(TraceError, match=r"cut\.oracleGeneral\.bin\.zst: (corrupt|truncated)"):
        read_trace(cut)


def test_csv_columns_by_name_or_position_read_other_tools_traces(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("op,ts,obj,bytes\nGET,1,a,10\nGET,2,b,20\nGET,3,a,10\n")
    by_name = read_trace(path, ["ts", "obj", "bytes"])
    by_position = read_trace(path, ["2", "3", "4"])
    for t in (by_name, by_position):
        assert t.key_strings() == ["a", "b", "a"] and t.sizes.tolist() == [10, 20, 10]
        assert t.times.tolist() == [1.0, 2.0, 3.0]
    headless = tmp_path / "headless.csv"
    headless.write_text("1,a,10\n2,b,20\n")
    assert read_trace(headless, ["1", "2", "3"]).key_strings() == ["a", "b"]
    with pytest.raises(TraceError, match=r"no column named 'size'; the header has"):
        read_trace(path, ["ts", "obj", "size"])
    with pytest.raises(TraceError, match=r"other.csv:3: size 'x' is not an integer"):
        path.write_text("ts,obj,bytes\n1,a,10\n2,b,x\n")
        read_trace(path, ["ts", "obj", "bytes"])


def test_a_trace_separated_by_spaces_is_read_as_lrb_and_webcachesim_write_them(tmp_path):
    """``.txt``: time, key and size the first three fields (LRB's features after them left),
    no header, blank lines skipped; other positions by ``columns``."""
    path = tmp_path / "lrb.txt"
    path.write_text("1 obj-a 100 7 0.5\n\n2\tobj-b 2000 3 0.1\n3 obj-a 100 7 0.5\n")
    trace = read_trace(path)
    assert trace.key_strings() == ["obj-a", "obj-b", "obj-a"]
    assert trace.sizes.tolist() == [100, 2000, 100] and trace.times.tolist() == [1, 2, 3]
    picked = read_trace(path, ["1", "2", "4"])
    assert picked.sizes.tolist() == [7, 3, 7]
    with pytest.raises(TraceError, match="has no header"):
        read_trace(path, ["time", "key", "size"])
    bad = tmp_path / "bad.txt"
    bad.write_text("1 a 100\n\n\n\n5 b lots\n")  # blank lines counted
    with pytest.raises(TraceError, match=r"bad.txt:5: size 'lots' is not an integer"):
        read_trace(bad)
    bad.write_text("# a comment\n1 a 100\n")  # no header: said, not skipped
    with pytest.raises(TraceError, match=r"bad.txt:1: time '#' is not a number"):
        read_trace(bad)
    bad.write_bytes(b"1 \xff\xfe 100\n")
    with pytest.raises(TraceError, match="not UTF-8 text"):
        read_trace(bad)
    bad.write_text("1 a 99999999999999999999999\n")
    with pytest.raises(TraceError, match=r"bad.txt:1: size .* is past 2\*\*63 - 1 bytes"):
        read_trace(bad)
    written = tmp_path / "again.txt"  # written as read
    write_trace(trace, written)
    assert read_trace(written).key_strings() == trace.key_strings()


@pytest.mark.parametrize(
    ("text", "named"),
    [("1 a 100\n2 b 200\n", "t.txt (fields separated by spaces"),
     ("ts,obj,bytes\n1,a,100\n", "t.csv, and give --csv-columns"),
     ("1 caf\u00e9 100\n" * 2, "t.txt (fields"),  # UTF-8, not ASCII
     ("1 " + "k" * 5000 + " 100\n", "t.txt (fields")],  # a first line past the block read
)  # fmt: skip
def test_a_text_trace_under_another_suffix_is_refused_with_the_name_to_give_it(
    tmp_path, text, named
):
    """Read as oracleGeneral records, text gives nonsense requests silently: it is refused,
    naming the suffix that reads it."""
    path = tmp_path / "t.log"
    path.write_text(text)
    with pytest.raises(TraceError, match=re.escape(named)):
        read_trace(path)
