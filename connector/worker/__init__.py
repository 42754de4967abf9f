"""One worker rank: :mod:`.proxy` stands in for vLLM's OffloadingWorker (transfers
timed, loads of promoted rows checked), :mod:`.tally` keeps its transfers between two
flushes. No re-exports here.
"""
