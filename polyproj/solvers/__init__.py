"""Algorithms polyproj owns, written against the array API standard.

Each runs on NumPy, PyTorch (CPU or CUDA), CuPy and ``array_api_strict`` arrays and returns arrays of
the input's namespace and device. Nothing here knows the backend registry: the glue modules in
:mod:`polyproj.backends` map these algorithms to the :class:`~polyproj.backends.base.QPSolver`
interface.

- :mod:`polyproj.solvers.ipm`: the batched Mehrotra predictor–corrector interior-point method;
- :mod:`polyproj.solvers.admm`: the batched ADMM on one shared factorisation (the ``admm`` backend).
"""
