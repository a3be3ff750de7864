"""Study: the experiment matrix. Operating regions and the capacity cache (`regions`; what a
region's rho is anchored on is the engine's, `schedport.engine.capacity`), the sweep of
schedulers x windows x regions (`sweep`: the run loop; `selection`, the cells; `tasks`, the work a
worker does; `executors`, where it runs; `progress`), and the results store (`store`).
Uses the engine and the workload; never analyses its own results.
"""
