"""Promoted rows checked before a rank loads them.

:mod:`.checksums`: the digests and the checksum policy; :mod:`.promoted_rows`: both sides
of the check (the scheduler digests a promotion's rows, a rank compares its own mapping,
a refused load quarantines the keys); :mod:`.shared_region`: which ranks map the
scheduler's own file and so need no check. Imports no vLLM. No re-exports here.
"""
