"""Every finding's facts: typed records that --json carries and SCHEMA.md documents."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvscope.diagnostics.classifiers import CLASSIFIERS, anomaly_facts, healthy, shared_facts
from kvscope.diagnostics.model import Facts
from kvscope.diagnostics.verdict import diagnose as verdict
from kvscope.diagnostics.verdict.diagnose import diagnose

from .support import evidence
from .test_golden import CASES

SCHEMA = (Path(verdict.__file__).parents[1] / "SCHEMA.md").read_text()


def _records() -> list[type]:
    """Every dataclass the classifiers declare for their facts, nested ones too."""
    out = []
    for mod in (*CLASSIFIERS, healthy, verdict, shared_facts, anomaly_facts):
        out += [c for c in vars(mod).values() if isinstance(c, type)
                and dataclasses.is_dataclass(c) and c.__module__ == mod.__name__]
    return out


def test_every_facts_record_and_field_is_in_the_schema():
    facts = [c for c in _records() if issubclass(c, Facts)]
    assert len(facts) >= len(CLASSIFIERS) + 3  # one or more per class, healthy, inconclusive, error
    for c in facts:
        assert f"`{c.__name__}`" in SCHEMA, c.__name__
    for c in _records():
        for f in dataclasses.fields(c):
            assert f"`{f.name}" in SCHEMA, (c.__name__, f.name)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_json_carries_each_verdicts_facts_and_renders_the_same_lines(case):
    report = diagnose(evidence(CASES[case]()))
    doc = json.loads(report.to_json())
    for f, v in zip(report.verdicts, doc["verdicts"], strict=True):
        assert v["facts"]["type"] == type(f.facts).__name__
        assert v["facts"] == json.loads(json.dumps(f.facts.to_dict()))
        assert v["evidence"] == f.facts.lines()  # the prose, from the facts alone
