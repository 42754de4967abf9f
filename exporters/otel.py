"""OpenTelemetry wiring: spans go to the tracer provider the application installed.

* A ``tracer_provider`` passed in wins (tests pass one with an in-memory exporter).
* Else the global provider is used as it is: the one the application installed
  (``vllm serve --otlp-traces-endpoint`` installs one), else a no-op.
* Only when kvscope's own option asks for it (``"otlp_traces": true`` in the
  connector's kvscope settings; needs the ``otlp`` extra) and no application
  provider exists does kvscope install an SDK provider exporting over OTLP/HTTP
  (endpoint from the standard ``OTEL_EXPORTER_OTLP_*`` environment).

Spans never carry prompt text, raw request ids or block hashes: requests are
identified by :func:`request_id_hash`, a salted, truncated digest that lets a
reader correlate spans within one process and nothing more.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading

from opentelemetry import trace
from opentelemetry.trace import Tracer, TracerProvider

from kvscope import __version__
from kvscope.exporters import signals

logger = logging.getLogger("kvscope")

_SALT = os.urandom(16)
_install_lock = threading.Lock()
_installed: TracerProvider | None = None


def request_id_hash(request_id: str) -> str:
    return hashlib.blake2b(request_id.encode(), key=_SALT, digest_size=6).hexdigest()


def _maybe_install_otlp() -> None:
    global _installed
    with _install_lock:
        if _installed is not None:
            return
        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            return  # the application configured tracing itself; respect it
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:  # telemetry never breaks serving: say so, go on
            logger.warning("kvscope: otlp_traces needs pip install 'kvscope[otlp]' (%s); "
                           "spans stay with the application's tracer provider", exc)
            return

        provider = SDKTracerProvider(resource=Resource.create(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME", "vllm-kvscope")}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        _installed = provider
        logger.info("kvscope: exporting spans over OTLP/HTTP")


def get_tracer(tracer_provider: TracerProvider | None = None, *,
               install_otlp: bool = False) -> Tracer:
    """``install_otlp``: kvscope's own ``otlp_traces`` option (see the module doc)."""
    if tracer_provider is None:
        if install_otlp:
            _maybe_install_otlp()
        tracer_provider = trace.get_tracer_provider()
    return tracer_provider.get_tracer(signals.TRACER_NAME, __version__)


def tracing_enabled(tracer: Tracer) -> bool:
    """False while spans would be dropped anyway (no provider passed in or installed).

    Lets hot paths skip building span attributes; re-checked periodically since
    an application may install a provider after kvscope started.
    """
    if isinstance(tracer, trace.NoOpTracer):
        return False
    if isinstance(tracer, trace.ProxyTracer):
        return not isinstance(trace.get_tracer_provider(),
                              (trace.ProxyTracerProvider, trace.NoOpTracerProvider))
    return True
