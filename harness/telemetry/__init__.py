"""What a level cost beyond client-side time: GPU power and clocks, the server's own counters,
dollars per million tokens, and the distance to the hardware's roofline.

Every source here is optional: a machine without a GPU library or a server without /metrics
yields null fields with a one-line reason, never a failed sweep.
"""
