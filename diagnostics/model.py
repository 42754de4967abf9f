"""Data shared by every layer of kv-diagnose.

Two levels:

* :class:`RawWindow` is what a source (Prometheus, a live scrape, a bundle)
  yields: plain labelled series with timestamped samples. A bundle is a
  serialised ``RawWindow``.
* :class:`Quantity` is one aggregated signal over the window, the unit the
  typed evidence model (:mod:`kvscope.diagnostics.evidence.build`) is built from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

Labels = tuple[tuple[str, str], ...]
Samples = tuple[tuple[float, float], ...]

# Labels that say *where* a series came from, not what it measures. They are
# summed away when signals are aggregated (per-target facts are kept apart).
LOCATION_LABELS = frozenset({"instance", "job", "model_name", "engine", "__name__"})


class DiagnoseError(Exception):
    """Any input kv-diagnose cannot diagnose from: the CLI prints it on one line, exit 2."""


@dataclass(frozen=True)
class Series:
    name: str
    labels: Labels  # sorted (name, value) pairs, without __name__
    target: str  # the scraped URL, or Prometheus' instance label
    samples: Samples  # (unix seconds, value), ascending

    def label(self, key: str, default: str = "") -> str:
        for k, v in self.labels:
            if k == key:
                return v
        return default


@dataclass(frozen=True)
class SourceInfo:
    """Where the evidence came from and what its window means."""

    kind: str  # "prometheus" | "scrape"  (a bundle keeps the kind it was recorded from)
    location: str  # Prometheus URL, the scraped URLs (space separated), or the bundle path
    start: float  # window start (unix seconds); a scrape: the first scrape
    end: float  # window end; a scrape: the second scrape
    now: float  # the source's "now" (freshness is judged against it)
    lifetime: bool  # True: counters are process-lifetime totals (scrape source)
    recent_span: float  # seconds covered by Quantity.recent
    selector: str = ""
    bundle: str = ""  # path of the bundle this was read from, if any

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "location": self.location,
            "start": self.start,
            "end": self.end,
            "now": self.now,
            "lifetime": self.lifetime,
            "recent_span": self.recent_span,
            "selector": self.selector,
            "bundle": self.bundle,
        }

    @classmethod
    def from_dict(cls, d: dict) -> SourceInfo:
        return cls(
            kind=str(d["kind"]),
            location=str(d["location"]),
            start=float(d["start"]),
            end=float(d["end"]),
            now=float(d["now"]),
            lifetime=bool(d["lifetime"]),
            recent_span=float(d["recent_span"]),
            selector=str(d.get("selector", "")),
            bundle=str(d.get("bundle", "")),
        )


@dataclass(frozen=True)
class RawWindow:
    source: SourceInfo
    series: tuple[Series, ...]
    # Targets (or queries) that gave nothing usable, one line each
    # ("rank endpoint X unreachable: ..."): the diagnosis runs on the rest.
    failures: tuple[str, ...] = ()
    # What the source dropped or capped, for the report's notes.
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Quantity:
    """One signal over the window, already summed (or max-ed) over series.

    ``increase`` is the growth of a counter over the window (reset-aware; for a
    scrape source, the process-lifetime total); for a gauge it is last - first.
    ``recent`` is the same over the last ``SourceInfo.recent_span`` seconds: for
    a scrape, the change between the two scrapes, i.e. "is it still happening".
    """

    first: float = 0.0
    last: float = 0.0
    increase: float = 0.0
    recent: float = 0.0
    min: float = 0.0
    max: float = 0.0
    samples: Samples = ()
    present: bool = False  # False: no series of this signal at all

    def __bool__(self) -> bool:  # guard against `if q:` mistakes
        raise TypeError("use .present, .last or .increase")


ABSENT = Quantity()


@dataclass(frozen=True)
class Mark:
    """A point of evidence to mark on the plot."""

    series: str  # a panel key of kvscope.diagnostics.report.plot
    t: float
    text: str


@dataclass(frozen=True)
class Facts:
    """The decisive numbers and names a finding rests on, typed: the model its evidence
    lines are rendered from (``lines``) and what ``--json`` carries as ``facts``.

    A classifier declares its facts as a frozen dataclass subclassing this one, in its own
    module (or, when long, a ``*_facts`` module beside it), one per verdict form where they
    differ (``VetoFacts``; ``ChurnFacts`` and ``OwnRowsFacts``). Fields hold
    what the window showed, not words: ``float`` for counts as read (counters are floats),
    ``int`` for rows/keys derived, ``str`` for names (ranks, KV groups, series), ``bool``
    for a sub-case, ``None`` where the input lacked it, tuples of those or of nested frozen
    dataclasses for per-rank / per-group rows, dicts keyed by a label value. ``lines()`` renders the evidence prose from
    the fields alone (no Evidence at hand: what the text shows, the JSON holds); tests
    assert on the fields, the golden reports on the prose. Document the fields per verdict
    in ``diagnostics/SCHEMA.md``.
    """

    def lines(self) -> list[str]:
        raise NotImplementedError

    def to_dict(self) -> dict:
        """``type`` (the record's class name: which fields follow) and the fields, nested
        records as objects, tuples as lists (JSON)."""
        return {"type": type(self).__name__, **asdict(self)}


@dataclass
class Finding:
    """One verdict a classifier holds: its facts (evidence rendered from them) and the next
    step."""

    id: str
    title: str
    confidence: float  # 0..1
    facts: Facts
    next_step: str
    severity: int = 50  # 0..100: how bad if true (ranking tie-break)
    marks: list[Mark] = field(default_factory=list)
    uses_gauges: bool = False  # judged from gauges: void if telemetry is stale
    # "incident": an incident class or anomaly holds; "error": a check itself
    # failed (a kv-diagnose bug or an input it cannot read): never a pass,
    # never an incident; "healthy"/"inconclusive": the verdict when none holds.
    kind: str = "incident"

    @property
    def evidence(self) -> list[str]:
        """The evidence lines, rendered from the facts."""
        return self.facts.lines()

    @property
    def confidence_label(self) -> str:
        if self.confidence >= 0.75:
            return "high"
        if self.confidence >= 0.45:
            return "medium"
        return "low"

    @property
    def score(self) -> tuple[int, int, int, float]:
        """Rank: incidents before errors, then confidence band, how bad it is if
        true, confidence."""
        band = {"high": 2, "medium": 1, "low": 0}[self.confidence_label]
        return (int(self.kind == "incident"), band, self.severity, self.confidence)


@dataclass(frozen=True)
class Unchecked:
    """A check that could not run: its inputs were missing or non-finite."""

    check: str  # the classifier's ID
    what: str  # the classifier's CHECK sentence
    reasons: tuple[str, ...]  # "series X missing", "series X non-finite", ...

    @property
    def line(self) -> str:
        return f"could not check {self.check} ({self.what}): " + "; ".join(self.reasons)
