"""What a run records and how it is written down: the schema of runs, levels and requests and the
bounds every stored value keeps, the k2bench.run JSON document, the configuration fingerprint,
provenance and the reproduction record (secrets masked through k2bench.harness.redact).
"""
