"""A repository's past: measuring its commits (backfill), which stored change points need a bisect,
and finding the first commit that got worse (bisect).
"""
