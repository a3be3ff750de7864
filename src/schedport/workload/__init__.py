"""Workload: request traces and where they come from.

The trace format (`trace`), the public data files and their integrity (`datadir`), one adapter
per public source (`sources`), and the frozen corpus of windows the study runs on (`corpus`).
Depends only on `schedport.common` and `schedport.errors`.
"""
