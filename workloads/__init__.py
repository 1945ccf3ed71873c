"""Workload definitions (data files in defs/) and their loader."""
