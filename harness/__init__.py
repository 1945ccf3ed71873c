"""The benchmarking harness, one folder per stage of a sweep's flow (docs/development.md draws it):

commands/ (the CLI's doors) -> plan/ (what a sweep is) -> run/ (the level loop) -> servers/ (the
server under test) and load/ (requests, raw stamps) -> measure/ and telemetry/ (a level's figures)
-> record/ and store/ (what is kept, where) -> analysis/ and history/ (judged: the gate, change
points, bisect). importers/ and eval/ feed the store from other tools and from accuracy runs.

The harness never imports k2bench.engine: the bundled engine is started as a server
process through its recipe and measured over HTTP like any other engine.
"""
