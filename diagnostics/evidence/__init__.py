"""A source's raw window turned into the typed evidence the classifiers read.

:mod:`.build` fills :class:`.model.Evidence` from the rows of :mod:`.read_table`, through
:mod:`.quantities` (reset-aware sums), :mod:`.targets` (what each process says about
itself) and :mod:`.partial` (label values a relabel rule dropped). No re-exports here.
"""
