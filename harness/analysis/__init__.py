"""Analysis of stored runs: Pareto frontiers, statistics, regression verdicts, change points."""
