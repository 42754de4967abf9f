"""The diagnosis as the operator reads it: text and JSON (:mod:`.diagnosis`), and a plot of
each finding's decisive comparison (:mod:`.plot`, its panels in :mod:`.panels`). No
re-exports here.
"""
