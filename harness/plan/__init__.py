"""What a sweep is before it runs: its settings (one declaration, their parsers and checks), suite files
expanded into jobs, and the estimate of how long it will take.
"""
