"""From raw records to a level's figures: metric definitions (the catalogue), their computation, and
whether a level may enter the history.
"""
