"""The planner's command line and the experiments behind it: `plan_command` (`minipd plan`,
with `size_sweep` and `plots`), `day_command` (`minipd day`: `day_workload`,
`day_experiment`) and `calibrate_command` (`minipd calibrate-distserve`: `distserve_example`).
Offline only: nothing that serves imports this package.
"""
