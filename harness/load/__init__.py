"""The load generator and what it hands on: streaming requests stamped on arrival as raw records, the
watch that stops a level whose server died, and a test server with known timing to check it against.
"""
