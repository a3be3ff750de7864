"""The analysis's parameters and their defaults, in one module free of numpy and scipy, so that
the command line can offer them (``schedport analyze --help``) without loading the analysis.
"""

#: Practical threshold on |relative effect| for the unbounded metrics (``--threshold``).
PRACTICAL_THRESHOLD = 0.05
#: Practical threshold on |absolute difference| for the bounded metrics (attainment, Jain
#: indices, shares; ``--abs-threshold``): 2 percentage points, since a relative difference of two
#: small shares is large for a negligible change (0.001 vs 0 is a relative effect of 2).
ABS_THRESHOLD = 0.02
#: Benjamini-Hochberg false discovery rate (``--q``).
Q = 0.05
#: Bootstrap replicates over windows (``--boot``).
N_BOOT = 1000
#: Random splits for the split-half reliability, the noise ceiling (``--splits``).
SPLITS = 1000
#: A (source, region) condition with fewer complete windows than this is skipped.
MIN_WINDOWS = 2
#: The level of every interval the analysis reports.
CI_LEVEL = 0.95
