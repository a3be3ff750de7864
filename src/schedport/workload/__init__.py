"""Workload: request traces and where they come from.

The trace format (`trace`, its cell checks in `tracecheck`), the public data files and their
integrity (`datadir`), one adapter per public source (`sources`), and the frozen corpus of windows
the study runs on (`corpus`: build and verify; `corpus_manifest`, the stored corpus and its
hashes; `corpus_spec`, the spec; `corpus_windows`, the window rules; `corpus_expected`, the
frozen hashes). Depends only on `schedport.common` and `schedport.errors`.
"""
