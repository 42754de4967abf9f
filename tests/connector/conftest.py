from __future__ import annotations

import pytest

pytest.importorskip("vllm")


@pytest.fixture
def spans():
    """An in-memory OTel exporter wired into every ObservedOffloadingConnector built meanwhile."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from kvscope.connector import ObservedOffloadingConnector

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ObservedOffloadingConnector.tracer_provider = provider
    try:
        yield exporter
    finally:
        ObservedOffloadingConnector.tracer_provider = None
        provider.shutdown()
