"""The benchmarking harness: CLI, launcher, workloads, load generator, metrics, store, analysis.

The harness never imports k2bench.engine: the bundled engine is started as a server
process through its recipe and measured over HTTP like any other engine.
"""
