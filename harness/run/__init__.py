"""Where a level is run: the sweep's level loop (server, prompts, load, figures, store, one level at a
time), and suite jobs run here or dispatched to a fleet.
"""
