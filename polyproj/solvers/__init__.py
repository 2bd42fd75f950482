"""Algorithms polyproj owns, written against the array API (no registry knowledge).

- :mod:`polyproj.solvers.admm` — batched ADMM on one shared factorisation (the ``admm`` backend).
"""
