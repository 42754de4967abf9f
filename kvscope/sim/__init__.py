"""The CPU harness: vLLM's real scheduler on CPU, for the demo, the tests and the benchmarks.

Its own subpackage behind the ``sim`` extra (vLLM, with the torch and transformers it
brings): the served connector (``kvscope.connector``) never imports it.
"""
