"""The server under test: engine recipes as data; starting it, waiting until it serves, asking what it
serves, and always stopping it (it never outlives its sweep).
"""
