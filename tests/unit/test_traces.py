"""Trace loaders and transforms against the facts in sim/data/README.md."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.traces import (
    PACKAGED,
    Trace,
    TraceError,
    load_azure_csv,
    load_mooncake_jsonl,
    load_trace,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def azure() -> Trace:
    return load_trace("azure-conv")


@pytest.fixture(scope="module")
def mooncake() -> Trace:
    return load_trace("mooncake")


def test_azure_facts(azure: Trace) -> None:
    # README: 19,366 requests over 3,502 s, 5.5 req/s, 1-s peak 16
    assert len(azure) == 19366
    assert azure.duration_s == pytest.approx(3502, abs=1.0)
    assert azure.mean_qps == pytest.approx(5.5, abs=0.05)
    assert np.bincount(azure.arrival_s.astype(int)).max() == 16
    assert azure.arrival_s[0] == 0.0 and np.all(np.diff(azure.arrival_s) >= 0)
    assert azure.hash_ids is None
    # README percentiles: prompt p50/p90/p99 1020/2734/4142, output 129/424/601
    np.testing.assert_allclose(np.percentile(azure.prompt_tokens, [50, 90, 99]), [1020, 2734, 4142], atol=1)
    np.testing.assert_allclose(np.percentile(azure.output_tokens, [50, 90, 99]), [129, 424, 601], atol=1)


def test_azure_timestamp_precision(azure: Trace) -> None:
    # 18:15:46.6805900 -> 18:15:50.9951690: 7 fractional digits kept (100 ns)
    assert azure.arrival_s[1] == pytest.approx(4.314579, abs=1e-9)


def test_mooncake_facts(mooncake: Trace) -> None:
    # README: 12,031 requests over 3,537 s, every request shares block 0, p50 prompt 6,909
    assert len(mooncake) == 12031
    assert mooncake.arrival_s[-1] == pytest.approx(3537, abs=1.0)
    assert all(h[0] == 0 for h in mooncake.hash_ids)
    assert np.percentile(mooncake.prompt_tokens, 50) == 6909
    assert len(mooncake.hash_ids) == len(mooncake)


def test_mooncake_plain_and_gz_agree(tmp_path, mooncake: Trace) -> None:
    plain = tmp_path / "mc.jsonl"
    with gzip.open(PACKAGED["mooncake"], "rt") as src:
        plain.write_text("".join(next(src) for _ in range(50)))
    tr = load_trace(plain)  # auto-detected by content
    assert len(tr) == 50
    np.testing.assert_array_equal(tr.prompt_tokens, mooncake.prompt_tokens[:50])


@pytest.mark.parametrize("qps", [0.5, 5.5, 50.0, 200.0, 1000.0])
def test_scaled_rate_equals_target(azure: Trace, qps: float) -> None:
    s = azure.scaled_to_qps(qps)
    assert s.mean_qps == pytest.approx(qps, rel=1e-12)
    # shape kept: normalised inter-arrival gaps identical
    np.testing.assert_allclose(s.arrival_s / s.duration_s, azure.arrival_s / azure.duration_s, atol=1e-12)
    np.testing.assert_array_equal(s.prompt_tokens, azure.prompt_tokens)


@given(qps=st.floats(min_value=0.01, max_value=5000.0))
@settings(max_examples=30, deadline=None)
def test_scaled_rate_property(qps: float) -> None:
    tr = Trace(np.array([0.0, 1.0, 1.5, 4.0]), np.array([1, 2, 3, 4]), np.array([5, 6, 7, 8]))
    s = tr.scaled_to_qps(qps)
    assert s.mean_qps == pytest.approx(qps, rel=1e-9)
    assert np.all(np.diff(s.arrival_s) >= 0)


def test_window(azure: Trace) -> None:
    w = azure.window(600.0, 60.0)
    mask = (azure.arrival_s >= 600.0) & (azure.arrival_s < 660.0)
    assert len(w) == mask.sum()
    assert w.duration_s == 60.0
    assert w.arrival_s.min() >= 0 and w.arrival_s.max() < 60.0
    np.testing.assert_array_equal(w.prompt_tokens, azure.prompt_tokens[mask])


def test_window_keeps_hash_ids(mooncake: Trace) -> None:
    w = mooncake.window(300.0, 30.0)
    assert w.hash_ids is not None and len(w.hash_ids) == len(w)


def test_loop_to_repeats_and_keeps_rate(azure: Trace) -> None:
    s = azure.scaled_to_qps(100.0)
    long = s.loop_to(3.5 * s.duration_s)
    assert np.all(np.diff(long.arrival_s) >= 0)
    assert long.mean_qps == pytest.approx(100.0, rel=0.01)
    assert long.arrival_s.max() < 3.5 * s.duration_s
    shorter = s.loop_to(10.0)  # already long enough: truncated
    assert shorter.duration_s == 10.0 and shorter.arrival_s.max() < 10.0


def test_indices_between(azure: Trace) -> None:
    r = azure.indices_between(10.0, 20.0)
    assert all(10.0 <= azure.arrival_s[i] < 20.0 for i in r)
    assert len(r) == ((azure.arrival_s >= 10.0) & (azure.arrival_s < 20.0)).sum()


# malformed inputs: (file name, content, loader, message fragments)
BAD = [
    (
        "bad_ts.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1,2\nnot-a-date,3,4\n",
        load_azure_csv,
        [":3:", "TIMESTAMP"],
    ),  # bad timestamp on line 3
    (
        "bad_tok.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,x,2\n",
        load_azure_csv,
        [":2:", "token"],
    ),  # non-integer token count
    ("bad_hdr.csv", "time,a,b\n1,2,3\n", load_azure_csv, [":1:", "header"]),  # wrong header
    (
        "short.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1\n",
        load_azure_csv,
        [":2:", "columns"],
    ),  # missing column
    (
        "bad.jsonl",
        '{"timestamp": 0, "input_length": 1, "output_length": 2}\n{"timestamp": 3}\n',
        load_mooncake_jsonl,
        [":2:", "input_length"],
    ),  # missing key on line 2
    (
        "junk.jsonl",
        '{"timestamp": 0, "input_length": 1, "output_length": 2}\n{oops\n',
        load_mooncake_jsonl,
        [":2:"],
    ),  # invalid JSON
    ("what.txt", "hello\n", load_trace, [":1:", "unknown trace format"]),  # undetectable
]


@pytest.mark.parametrize("name,content,loader,fragments", BAD, ids=[b[0] for b in BAD])
def test_malformed_files_name_file_and_line(tmp_path, name, content, loader, fragments) -> None:
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(TraceError) as ei:
        loader(p)
    msg = str(ei.value)
    assert name in msg
    for frag in fragments:
        assert frag in msg


def test_missing_file_and_name() -> None:
    with pytest.raises(TraceError, match="no such trace"):
        load_trace("no-such-trace")


@pytest.mark.parametrize(
    "kwargs,param",
    [
        (dict(arrival_s=[1.0, 0.5], prompt_tokens=[1, 1], output_tokens=[1, 1]), "arrival_s"),  # unsorted
        (dict(arrival_s=[0.0], prompt_tokens=[1, 2], output_tokens=[1]), "prompt_tokens"),  # ragged
        (dict(arrival_s=[0.0], prompt_tokens=[-1], output_tokens=[1]), "prompt_tokens"),  # negative
        (dict(arrival_s=[0.0], prompt_tokens=[1], output_tokens=[1], hash_ids=[]), "hash_ids"),
        (dict(arrival_s=[0.0, 5.0], prompt_tokens=[1, 1], output_tokens=[1, 1], span_s=2.0), "span_s"),
    ],
)
def test_trace_validation_names_parameter(kwargs, param) -> None:
    with pytest.raises(TraceError, match=param):
        Trace(**{k: (np.array(v) if k != "hash_ids" and isinstance(v, list) else v) for k, v in kwargs.items()})


def test_trace_arrays_are_read_only(azure: Trace) -> None:
    with pytest.raises(ValueError):
        azure.arrival_s[0] = 5.0


def test_json_safe_first_rows(mooncake: Trace) -> None:
    json.dumps(mooncake.hash_ids[:3])
