"""Bundles: round trip, privacy of what is kept, and every way a file can be bad."""

from __future__ import annotations

import gzip
import json

import pytest

from kvscope.diagnostics.model import DiagnoseError, Series
from kvscope.diagnostics.report.diagnosis import format_text
from kvscope.diagnostics.sources.bundle import FORMAT, VERSION, read_bundle, to_dict, write_bundle
from kvscope.diagnostics.verdict.diagnose import diagnose_raw
from kvscope.exporters import signals as S

from .support import L, base, window


def _raw():
    d = base()
    d[L(S.ROW_CHECKSUMS.name, rank="1", outcome="mismatch")] = [2, 3]
    raw = window(d)
    junk = Series("request_prompt_info", (("prompt", "secret text"),), "t", ((0.0, 1.0),))
    return type(raw)(raw.source, raw.series + (junk,))


def test_round_trip_gives_the_same_report(tmp_path):
    raw = _raw()
    path = str(tmp_path / "i.kvb")
    n = write_bundle(raw, path, created_at=1.0)
    assert n == len(raw.series) - 1  # the foreign series is dropped
    back = read_bundle(path)
    assert back.source.bundle == path
    assert set(back.series) == {s for s in raw.series if s.name != "request_prompt_info"}
    a, b = diagnose_raw(raw), diagnose_raw(back)
    assert [f.id for f in a.verdicts] == [f.id for f in b.verdicts] == ["stale_row_corruption"]
    assert format_text(b).count(f"bundle {path}") == 1


def test_bundle_keeps_no_prompts_or_hashes(tmp_path):
    doc = to_dict(_raw(), created_at=1.0)
    assert doc["format"] == FORMAT and doc["version"] == VERSION
    assert "secret text" not in json.dumps(doc)
    allowed = {lbl for m in S.ALL_METRICS for lbl in m.labels} | {"model_name", "engine", "instance", "job", "reason"}
    assert {k for s in doc["series"] for k in s["labels"]} <= allowed


def _write(tmp_path, data: bytes, name="b.kvb"):
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def test_truncated(tmp_path):
    path = str(tmp_path / "i.kvb")
    write_bundle(_raw(), path)
    data = open(path, "rb").read()
    bad = _write(tmp_path, data[: len(data) // 2], "t.kvb")
    with pytest.raises(DiagnoseError, match="truncated or corrupt"):
        read_bundle(bad)


@pytest.mark.parametrize("payload,msg", [
    (b"not gzip at all", "not a kvscope bundle \\(not gzip data\\)"),
    (gzip.compress(b"{not json"), "corrupt \\(invalid JSON\\)"),
    (gzip.compress(b"\xff\xfe"), "corrupt \\(not UTF-8 JSON\\)"),
    (gzip.compress(json.dumps({"format": "other"}).encode()), "is not a kvscope bundle \\(format"),
    (gzip.compress(json.dumps([1, 2]).encode()), "is not a kvscope bundle \\(format"),
    (gzip.compress(json.dumps({"format": FORMAT, "version": 99}).encode()), "has version 99"),
    (gzip.compress(json.dumps({"format": FORMAT, "version": 1, "source": {}}).encode()),
     "corrupt \\(bad field"),
])
def test_foreign_or_corrupt(tmp_path, payload, msg):
    with pytest.raises(DiagnoseError, match=msg):
        read_bundle(_write(tmp_path, payload))


def test_missing_file(tmp_path):
    with pytest.raises(DiagnoseError, match="does not exist"):
        read_bundle(str(tmp_path / "nope.kvb"))
