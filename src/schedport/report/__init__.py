"""Report: renders `portability.json` (and `validation.json`) as a self-contained HTML page.

Only renders: it reads the analysis's JSON output and draws it, and never calls the analysis.
The page (`html`: `build_html`, `write_report`) is assembled from its sections: the figures of
the portability dict (`figures`), "Why it flips" from its ``explain`` block (`explain`), and the
simulator-vs-real-engine section of a validation dict (`validation`), all in one look (`style`).
"""

