"""Command-line values kv-diagnose accepts: durations, times, the window, and
which options apply to which source. Anything absurd is one clear line (exit 2),
never an internal error; an option that does not apply is refused, not ignored.
"""

from __future__ import annotations

import math
from datetime import datetime

from kvscope import durations

from .model import DiagnoseError

MAX_DURATION_S = 400 * 86400  # longer than any retention an incident needs
MAX_INTERVAL_S = 600.0  # between the two scrapes

# option dest -> the sources it applies to
APPLIES = {
    "since": ("prometheus",),
    "start": ("prometheus",),
    "end": ("prometheus",),
    "selector": ("prometheus",),
    "interval": ("scrape",),
    "timeout": ("prometheus", "scrape"),
    "deadline": ("prometheus", "scrape"),
}


def parse_duration(text: str, what: str = "duration") -> float:
    try:
        value = durations.seconds(text)
    except ValueError:
        raise DiagnoseError(f"bad duration {text!r}{'' if what == 'duration' else ' for ' + what} "
                            "(expected e.g. 90s, 30m, 1h, 2d)") from None
    if not math.isfinite(value) or value > MAX_DURATION_S:
        raise DiagnoseError(f"{what} {text!r} is longer than {MAX_DURATION_S // 86400} days")
    return value


def positive_duration(text: str, option: str, maximum: float = MAX_DURATION_S) -> float:
    value = parse_duration(text, option)
    if value <= 0:
        raise DiagnoseError(f"{option} must be > 0")
    if value > maximum:
        raise DiagnoseError(f"{option} {text!r} is more than {maximum:g} s")
    return value


def parse_time(text: str, now: float) -> float:
    """Unix seconds, RFC 3339 / ISO 8601, or 'now' / 'now-30m'."""
    t = text.strip()
    if t == "now":
        return now
    if t.startswith("now-"):
        return now - parse_duration(t[4:])
    try:
        value = float(t)
    except ValueError:
        value = None
    if value is not None:
        if not math.isfinite(value) or value < 0 or value > now + MAX_DURATION_S:
            raise DiagnoseError(f"time {text!r} is not a plausible unix time")
        return value
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise DiagnoseError(f"bad time {text!r} (expected unix seconds, RFC 3339 or now-30m)") from None
    if dt.tzinfo is None:
        raise DiagnoseError(f"time {text!r} has no timezone (add Z or +00:00)")
    try:
        return dt.timestamp()
    except (OverflowError, OSError, ValueError):
        raise DiagnoseError(f"time {text!r} is out of range") from None


def window(args, now: float) -> tuple[float, float, list[str]]:
    """(start, end, notes) of a Prometheus window; an end in the future is clipped
    to now and said so (the future has no samples: it would dilute the window)."""
    notes: list[str] = []
    end = parse_time(args.end, now) if args.end else now
    if end > now + 1:
        notes.append(f"--end {args.end} is {end - now:.0f} s in the future: clipped to now")
        end = now
    if args.since and args.start:
        raise DiagnoseError("give --since or --start, not both")
    if args.since:
        start = end - positive_duration(args.since, "--since")
    elif args.start:
        start = parse_time(args.start, now)
    else:
        raise DiagnoseError("--prometheus needs a window: --since 30m or --start/--end")
    if start >= now:
        raise DiagnoseError("--start is in the future: nothing to diagnose yet")
    if end <= start:
        raise DiagnoseError("empty window: --end must be after --start")
    if end - start > MAX_DURATION_S:
        raise DiagnoseError(f"window of {(end - start) / 86400:.0f} days is longer than "
                            f"{MAX_DURATION_S // 86400} days")
    return start, end, notes


def source_of(args) -> str:
    if getattr(args, "bundle", None):
        return "bundle"
    return "scrape" if args.scrape else "prometheus"


def refuse_inapplicable(args) -> None:
    """Options given that the chosen source would ignore: refused, like --scrape's."""
    src = source_of(args)
    bad = [f"--{k}" for k, applies in APPLIES.items()
           if getattr(args, k, None) not in (None, "") and src not in applies]
    if bad:
        where = " and ".join(sorted({s for k in bad for s in APPLIES[k[2:]]}))
        raise DiagnoseError(f"{'/'.join(bad)} appl{'y' if len(bad) > 1 else 'ies'} to "
                            f"--{where.replace(' and ', ' and --')}, not --{src}")
