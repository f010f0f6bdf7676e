"""Measured results in a profile: the entry model, the deterministic block, comparisons.

Pure: data in, data out. The filesystem side (reading a profile, the atomic write) is
toolkit/adapters/results_store.py.
"""
