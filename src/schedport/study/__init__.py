"""Study: the experiment matrix. Operating regions and capacity (`regions`), the sweep of
schedulers x windows x regions over executors (`sweep`), and the results store (`store`).
Uses the engine and the workload; never analyses its own results.
"""
