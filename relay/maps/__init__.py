"""Generated FutureMaps of the bundled schemas (``schemas/``).

Every other module here is written by ``relay generate``; never edit them by hand.
"""
