"""Reading a kvscope /metrics endpoint the way Prometheus would."""

from __future__ import annotations

import urllib.request
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


class Exposition:
    """Samples of one scrape: ``ex.value(name, **labels)`` sums the matching series."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                self.samples[s.name].append((dict(s.labels), s.value))

    @classmethod
    def scrape(cls, url: str) -> Exposition:
        return cls(fetch(url))

    def series(self, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        return [(lab, v) for lab, v in self.samples.get(name, [])
                if all(lab.get(k) == val for k, val in labels.items())]

    def value(self, name: str, **labels: str) -> float:
        return sum(v for _, v in self.series(name, **labels))

    def has(self, name: str) -> bool:
        return name in self.samples


def rounds_answered(engine) -> list:
    """What vLLM's scheduler gets back from each lookup round from here on (None:
    deferred), wrapped on the engine's connector: vLLM's truth, not kvscope's counters."""
    answers, ask = [], engine.connector.get_num_new_matched_tokens

    def counted(request, num_computed):
        out = ask(request, num_computed)
        answers.append(out[0])
        return out

    engine.connector.get_num_new_matched_tokens = counted
    return answers
