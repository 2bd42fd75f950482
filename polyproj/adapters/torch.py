"""Differentiable exact projection onto any :class:`~polyproj.sets.Projector` for PyTorch.

``y = Π_S(x)`` for a set ``S`` — a :class:`~polyproj.problem.Polyhedron` or constraint tensors
``{y : A y <= a, B y = b, lb <= y <= ub}`` (projected by a QP backend, then polished exactly), or a
structured set (``pp.sets.Simplex``, ``pp.sets.Box``, a set of yours). The forward is the set's
projection on the tensor's device; the backward is the set's HS-Jacobian product (for polyhedra also
the gradients with respect to ``A, a, B, b, lb, ub``: :mod:`polyproj.projection.backward`). This module
is conversion and autograd glue only: it holds no solver.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn
from torch.autograd import forward_ad as _forward_ad

from .. import registry
from ..api import check_flags
from ..errors import InfeasibleError, ProblemError, SettingsError
from ..problem import Polyhedron
from ..projection.pipeline import UNVERIFIED_VIOLATION, violates
from ..runtime import is_vmapped, small_work
from ..sets.base import Projector, as_namespace, third_party
from ..sets.detect import recognise
from ..sets.polyhedral import PARTS, Polyhedral, _as_like, polydata_from_arrays
from ..sets.simplex import CappedSimplex

__all__ = ["ProjectionLayer", "choose_backend", "project"]

_ft = torch._C._functorch


def _eager_under_compile(fn: Any) -> Any:
    """``fn`` run eagerly where ``torch.compile`` traces it: a graph break, compiled code around it.

    The projection leaves torch (NumPy, the solvers' extensions) and keeps Python state (the set cache, a
    warm start), which Dynamo cannot trace: traced, it failed on whichever batch first took a NumPy branch.
    ``torch.compiler.disable`` is applied on the first call under compilation (importing Dynamo costs
    seconds, so not at import), and a plain call is the function itself.
    """
    disabled: list[Any] = []

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            if not disabled:
                disabled.append(torch.compiler.disable(fn))
            return disabled[0](*args, **kwargs)
        return fn(*args, **kwargs)

    run.__prepare_scriptable__ = _refuse_script  # type: ignore[attr-defined]  # torch.jit.script of a caller
    return run


def _refuse_script(*_: Any) -> Any:
    """``torch.jit.script`` of the layer (its ``__prepare_scriptable__``) or of a function calling :func:`project`.

    TorchScript compiles Python source; the projection's is not TorchScript (it runs NumPy and the solvers), and
    the compiler's own error would name a construct of this module, not the layer.
    """
    raise ProblemError("torch.jit.script cannot compile the projection layer (its forward runs solvers outside "
                       "torch); torch.compile works (the layer is a graph break)")


def choose_backend(x: torch.Tensor, shared: bool) -> str:
    """The ``backend="auto"`` rule for ``x`` (:func:`polyproj.backends.defaults.auto_projection`).

    ``x``: a tensor of points, shape (..., n) with n >= 1; ``shared``: whether the constraint matrices are shared
    by the batch (True or False).
    """
    from ..backends.defaults import auto_projection

    if not isinstance(x, torch.Tensor) or x.ndim < 1 or x.shape[-1] == 0:
        raise ProblemError("choose_backend: x must be a torch.Tensor of points, shape (..., n) with n >= 1, got "
                           + (f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__))
    check_flags(shared=shared)
    batch = int(np.prod(x.shape[:-1])) if x.ndim > 1 else 1
    return auto_projection(shared, batch, x.device.type == "cpu", n=int(x.shape[-1]))


# ----------------------------------------------------------------------------- the Function
def _work(x: torch.Tensor, S: Projector) -> float:
    """Multiply-adds of one sweep over the batch (the thread policy of :func:`polyproj.runtime.small_work`)."""
    rows = 2 * S.n
    if isinstance(S, Polyhedral):
        rows += S.data.m + S.data.p
    return float(x.shape[0]) * rows * S.n


@dataclass(frozen=True)
class _Config:
    """What the Function needs besides tensors: the names of the set's differentiable data, a warm start."""

    names: tuple[str, ...] = ()
    warm: Any = None


@dataclass(frozen=True)
class _Folded:
    """A result of :meth:`_Project.vmap`: ``inner`` projected ``size`` slices of ``rows`` points as one batch.

    ``level`` names the vmap level folded into it (the one below it, as ``maybe_current_level`` reads
    inside the rule).
    """

    inner: Any
    level: Any
    size: int
    rows: int


@dataclass(frozen=True)
class _Sliced:
    """A result of :meth:`_Project.vmap` that projected each slice of the mapped level alone: ``parts[v]``.

    For a third party's set with parameters (:func:`_per_point_names`), whose layout only the set knows.
    """

    parts: tuple
    level: Any


def _unfold(res: Any, g: torch.Tensor) -> Any:
    """The innermost result, once every fold's level has mapped ``g`` onto its rows (:meth:`_VJP.vmap`).

    A fold left here means a cotangent the mapped level does not batch (the same for every slice, e.g.
    ``vmap(grad(lambda x: project(x).sum()))``) while the product differs from slice to slice: refused,
    rather than one slice's answer for all.
    """
    while isinstance(res, (_Folded, _Sliced)):
        size = res.size if isinstance(res, _Folded) else len(res.parts)
        if size > 1 or (isinstance(res, _Folded) and g.shape[0] != res.rows):
            raise ProblemError("torch.func.vmap of a derivative whose output gradient does not depend on the mapped "
                               "input (e.g. grad of project(x).sum()) is not supported: project the batch at once, "
                               "or use jacrev / a loss that depends on the output")
        res = res.inner if isinstance(res, _Folded) else res.parts[0]
    return res


def _per_point_names(S: Projector) -> tuple[str, ...] | None:
    """The names of ``S``'s parameters that hold one entry per point; None where only the set knows which.

    polyproj's sets say it: a simplex's ``(batch,)`` total (``per_sample``; a 0-d total is shared), a Polyhedral
    set's data under vmap (shared: per-sample data are refused there), no parameters for the others. A third
    party's set declares nothing, and a shared vector of its parameters whose length is the number of points
    cannot be told from one entry per point (a shared ``w`` of shape (n,) was tiled when a slice held n points).
    """
    if isinstance(S, CappedSimplex):
        return ("total",) if S.per_sample else ()
    if not third_party(S) or not S.parameters():
        return ()
    return None


def _tile(v: Any, V: int, N: int, name: str) -> Any:
    """``v``, one entry per point of a slice (N), repeated ``V`` times along its first axis."""
    if getattr(v, "ndim", 0) < 1 or int(v.shape[0]) != N:
        raise ProblemError(f"the set's {name} has shape {tuple(getattr(v, 'shape', ()))}, one entry per point, but "
                           f"each slice of torch.func.vmap has {N} points")
    if isinstance(v, torch.Tensor):
        return v.repeat(V, *([1] * (v.ndim - 1)))
    return np.tile(np.asarray(v), (V,) + (1,) * (np.ndim(v) - 1))


class _Project(torch.autograd.Function):
    """``y = Π_S(x)`` with the set's HS-Jacobian backward; ``params`` are the set's differentiable data.

    Composable with ``torch.func``: ``vmap`` folds the mapped dimension into the batch (shared constraint
    data), ``jacrev`` maps the backward (:class:`_VJP`), ``jacfwd`` uses :meth:`jvp` (``J`` is symmetric).
    """

    @staticmethod
    def forward(x, S, cfg, *params):
        names = cfg.names
        Sx = S.with_parameters(**{k: p.detach() for k, p in zip(names, params, strict=True)}) if names else S
        if x.shape[0] == 0:  # an empty batch projects to an empty batch
            return x.detach().clone(), Sx.empty_result(x.detach()), Sx
        xd = x.detach()
        host = _on_host(xd, Sx)
        # here, not in project(): under vmap x is a plain tensor only here (on the host: NumPy's test, cheaper)
        if not bool(np.isfinite(xd.numpy()).all() if host else torch.isfinite(xd).all()):
            raise ProblemError("x contains NaN or inf")
        with torch.no_grad(), small_work(x.device.type == "cpu", _work(x, Sx)):
            if host:
                res = _usable(Sx.project_batch(xd.numpy(), record=True, warm_start=cfg.warm), Sx.data)
                return torch.from_numpy(np.array(res.y, dtype=_NP[x.dtype])), res, Sx
            if isinstance(Sx, Polyhedral):
                res = _usable(Sx.project_batch(xd, record=True, warm_start=cfg.warm), Sx.data)
            else:  # a structured set: its answers too are checked before they are returned
                res = _usable(Sx.checked_result(Sx.project_batch(Sx.own_copy(xd)), xd))
        # a copy: the output must not be the tensor the result (kept by ctx) holds, or ctx -> result -> y ->
        # grad_fn -> ctx is a reference cycle through autograd that Python's gc cannot free (graphs leak)
        return res.y.to(x.dtype, copy=True), res, Sx

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, res, Sx = output
        ctx.result, ctx.set = res, Sx
        ctx.names = inputs[2].names
        # an input without a tangent (data that require grad, under jacfwd in x) reaches jvp as None, not as a zero
        # tensor that reads as a tangent on the data (jacfwd / hessian in x were refused on layers with learned data)
        ctx.set_materialize_grads(False)
        # for a graph of the backward (create_graph); not under torch.func transforms, whose backward is a
        # Function of gy alone (:class:`_VJP`), also when it runs after them (torch.func.vjp's function)
        ctx.graph_inputs = not torch._C._are_functorch_transforms_active()
        # x and the data: the graph's inputs (create_graph), and under torch.func the data, which the backward's
        # product J g and the data gradients depend on (an outer level that differentiates them is refused)
        ctx.save_for_backward(inputs[0], *inputs[3:])

    @staticmethod
    def backward(ctx, gy, *_):
        if gy is None:  # (grads are not materialised: y took no part in what is differentiated)
            return (None,) * (3 + len(ctx.names))
        return _legacy_batching_guard(ctx, gy, _Project._backward)

    @staticmethod
    def _backward(ctx, gy):
        need = ctx.needs_input_grad
        wanted = tuple(k for k, nd in zip(ctx.names, need[3:], strict=True) if nd)
        args = (gy, ctx.set, ctx.result, wanted, bool(need[0]))
        # the product is a Function of gy only for a graph of the backward (create_graph, torch.func); with
        # create_graph it also depends on x and the data (:class:`_VJPGraph`)
        functorch = torch._C._are_functorch_transforms_active()
        dual = not functorch and _forward_ad._current_level >= 0 and _has_tangent(gy, *ctx.saved_tensors)
        if dual:  # eager forward-over-reverse: the product's tangent by _VJP's jvp rule (through apply)
            _refuse_forward_through_data(ctx.set, wanted, tuple(_tangent(p) for p in ctx.saved_tensors[1:]),
                                         x_tangent=_tangent(ctx.saved_tensors[0]), gy_tangent=_tangent(gy))
        if functorch or (torch.is_grad_enabled() and not ctx.graph_inputs) or (dual and not torch.is_grad_enabled()):
            out = _VJP.apply(*args, *ctx.saved_tensors[1:])
        elif torch.is_grad_enabled():
            out = _VJPGraph.apply(*args, *ctx.saved_tensors)
        else:
            out = _VJP.forward(*args)
        grads = dict(zip(wanted, out[1:], strict=True))
        return (out[0] if need[0] else None, None, None, *[grads.get(k) for k in ctx.names])

    @staticmethod
    def jvp(ctx, x_t, *tangents):
        if any(t is not None for t in tangents[2:]):
            raise ProblemError("forward-mode derivatives with respect to constraint tensors are not supported; "
                               "use reverse mode (backward, torch.func.jacrev) for them (a constraint tensor "
                               "created inside a function that torch.func.jacfwd / jvp transforms counts as "
                               "one: create it outside)")
        return _VJP.apply(x_t, ctx.set, ctx.result, (), True)[0], None, None  # J x_t (J is symmetric)

    @staticmethod
    def vmap(info, in_dims, x, S, cfg, *params):
        if any(d is not None for d in in_dims[3:]):
            raise ProblemError("torch.func.vmap over constraint tensors is not supported: give the tensors a "
                               "batch dimension instead (per-sample constraints)")
        if isinstance(S, Polyhedral) and S.data.batched:
            raise ProblemError("torch.func.vmap with per-sample constraint data is not supported: project the "
                               "whole batch at once")
        xb = x.movedim(in_dims[0], 0)
        V, N = xb.shape[0], xb.shape[1]
        level = torch._C._functorch.maybe_current_level()
        # Polyhedral data are shared here (per-sample data are refused above): never tiled, whatever their first
        # dimension (lb of shape (n,) or A of shape (m, n) when a slice holds n or m points)
        per_point = _per_point_names(S)
        if per_point is None and V:  # a third party's parameters, shared or per point: each slice with the set as given
            outs = [_Project.apply(xb[v], S, _Config(cfg.names), *params) for v in range(V)]
            return (torch.stack([o[0] for o in outs]), _Sliced(tuple(o[1] for o in outs), level), outs[0][2]), \
                (0, None, None)
        # the per-point parameters (one total per point of a slice) serve every slice: tiled V times (torch.repeat
        # for the differentiated ones, whose gradient autograd sums back over the slices)
        per_point = per_point or ()
        params = tuple(_tile(p, V, N, k) if k in per_point else p for k, p in zip(cfg.names, params, strict=True))
        rest = {k: _tile(v, V, N, k) for k, v in S.parameters().items() if k in per_point and k not in cfg.names}
        if rest:
            S = S.with_parameters(**rest)
        y, res, Sx = _Project.apply(xb.reshape(V * N, xb.shape[-1]), S, _Config(cfg.names), *params)
        return (y.reshape(V, N, xb.shape[-1]), _Folded(res, level, V, N), Sx), (0, None, None)




def _tangent(t: Any) -> Any:
    """The forward-mode tangent of ``t`` at the current dual level (None for none, or not a tensor)."""
    return _forward_ad.unpack_dual(t).tangent if isinstance(t, torch.Tensor) else None


def _has_tangent(*ts: Any) -> bool:
    return any(_tangent(t) is not None for t in ts)


def _legacy_batching_guard(ctx: Any, g: torch.Tensor | None, backward: Callable[..., Any], *args: Any) -> Any:
    """``backward(ctx, *args)`` (``args``: ``(g,)`` by default), with torch's legacy batching named in its error.

    The backwards go through NumPy, which torch's legacy batching (``is_grads_batched``, the ``vectorize=True``
    of ``torch.autograd.functional``) cannot map: its RuntimeError becomes a ProblemError pointing to torch.func.
    """
    args = args or (g,)
    if g is None or not torch._C._functorch.is_legacy_batchedtensor(g):
        return backward(ctx, *args)
    try:
        return backward(ctx, *args)
    except RuntimeError as exc:  # torch's legacy batching has no rule for an op of the backward
        raise ProblemError(
            f"the backward of the projection onto {type(ctx.set).__name__} cannot run under torch's legacy "
            "batching (torch.autograd.functional.jacobian / hessian with vectorize=True, autograd.grad with "
            "is_grads_batched=True); use torch.func (jacrev, vmap of vjp), or vectorize=False") from exc


def _usable(res: Any, data: Any = None) -> Any:
    """``res`` when every point is one the layer can return: never a NaN or infeasible output.

    ``InfeasibleError`` for a point the backend left without an answer (NaN: e.g. inconsistent equalities
    it did not report) or an unverified one that violates its constraints by more than
    :data:`~polyproj.projection.pipeline.UNVERIFIED_VIOLATION` of each constraint's size (``data``: the
    polyhedron's :class:`~polyproj.polydata.PolyData`, :func:`~polyproj.projection.pipeline.violates`; None, a
    structured set: ``1 + max|y|``, the set's own violation measure).
    """
    if isinstance(res.y, np.ndarray) and bool(np.asarray(res.polished).all()) and np.isfinite(res.y).all():
        return res  # the common case, on the host: every point verified
    Y = torch.as_tensor(res.y) if not isinstance(res.y, torch.Tensor) else res.y
    nan = ~torch.isfinite(Y).all(dim=1)
    polished = torch.as_tensor(np.asarray(res.polished) if not isinstance(res.polished, torch.Tensor)
                               else res.polished, device=Y.device)
    if bool((polished & ~nan).all()):  # one device sync in the common case
        return res
    viol = torch.as_tensor(res.violation, device=Y.device)
    if data is not None:  # distances outside the constraints (pipeline.violates), in the data's namespace
        off = torch.as_tensor(violates(data, as_namespace(res.y, data.A)), device=Y.device)
    else:
        off = viol > UNVERIFIED_VIOLATION * (1.0 + torch.nan_to_num(Y).abs().amax(dim=1))
    bad = ~polished & off
    if bool(nan.any()):
        raise InfeasibleError(f"{int(nan.sum())} of {Y.shape[0]} points have no projection (backend {res.backend!r} "
                              "returned none; the polyhedron may be empty, e.g. inconsistent equalities, the "
                              "points too far from it for float64, |x| >> the set, or the data badly scaled: rows "
                              "or coordinates of very different sizes; another backend may solve them)")
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0, 0])
        raise InfeasibleError(f"{int(bad.sum())} of {Y.shape[0]} points could not be projected: the exact polish "
                              f"could not verify them and the backend's answer violates the constraints (point "
                              f"{i}: {float(viol[i]):.3g}); far points (|x| >> the polyhedron), badly scaled data "
                              "(rows or coordinates of very different sizes) or an empty polyhedron cause this")
    return res


#: CPU batches of at most this many points (None: any batch) onto shared polyhedral data are projected on
#: NumPy views of the tensors: the pipeline's small array operations cost ~1 µs each in NumPy against
#: several in torch, and its batched kernels (NumPy's gufuncs, torch's batched triangular solves on the
#: same memory) are as fast or faster from batch 1 to 4096 and n 10 to 500, on one thread and on two
#: (docs/torch.md, "Small batches"); 0 sends every batch through the torch namespace
HOST_BATCH: int | None = None
_NP = {torch.float32: np.float32, torch.float64: np.float64}


def _on_host(x: torch.Tensor, S: Projector) -> bool:
    """True when the forward of ``x`` runs on NumPy (a CPU batch onto shared polyhedral data, :data:`HOST_BATCH`)."""
    return (x.device.type == "cpu" and (HOST_BATCH is None or x.shape[0] <= HOST_BATCH)
            and isinstance(S, Polyhedral) and not S.data.batched)


def _is_host(res: Any) -> bool:
    """True for a result the forward computed on NumPy (:func:`_on_host`)."""
    return isinstance(res.y, np.ndarray)


def _backward_parts(S: Projector, res: Any, g: torch.Tensor, wanted: tuple[str, ...], need_x: bool,
                    groups: int | None = None):
    """``J g`` (or None) and the parameter gradients, as tensors; a NumPy result gets ``g`` on NumPy.

    ``groups`` (shared polyhedral data only): the data gradients of ``groups`` consecutive equal slices of
    the batch, each summed over its own rows (leading dimension ``groups``).
    """
    host = _is_host(res)
    gin = g.detach().numpy().astype(np.float64) if host else g  # astype copies
    if not host and third_party(S):
        gin = g.clone()  # a third party's vjp may write into its input: the autograd graph's gradient, not its own
    gx = S.vjp(res, gin) if need_x else None
    gp = {} if not wanted else S.parameter_vjp(res, gin, wanted, **({} if groups is None else {"groups": groups}))
    if third_party(S):
        gx, gp = _third_party_parts(S, gx, gp, g, wanted, need_x, groups, np.ndarray if host else torch.Tensor)
    if host:
        params = S.parameters()
        gx = None if gx is None else torch.from_numpy(np.asarray(gx)).to(g.dtype)
        gp = {k: torch.from_numpy(np.asarray(v)).to(params[k].dtype) for k, v in gp.items()}
    return gx, gp


def _third_party_parts(S: Projector, gx: Any, gp: Any, g: torch.Tensor, wanted: tuple[str, ...], need_x: bool,
                       groups: int | None, kind: type) -> tuple[Any, dict[str, Any]]:
    """A third party's ``vjp`` / ``parameter_vjp`` outputs checked before autograd takes them.

    A ``None`` from ``vjp`` would be read by autograd as a zero gradient (silently), a list, an array of
    another namespace or a wrong shape fails inside autograd with a message that names neither the set nor
    the method. ``J g`` of the points' size in another shape (a set flattening (batch, k, k)) is taken in
    ``g``'s shape. ``kind``: the array type the set was given its cotangent in.
    """
    name = type(S).__name__
    if need_x:
        shape = getattr(gx, "shape", None)
        if not isinstance(gx, kind):
            raise ProblemError(f"{name}.vjp returned {type(gx).__name__}; it was given its cotangent as "
                               f"{kind.__module__}.{kind.__name__} and must return J g as one, shape {tuple(g.shape)}")
        if math.prod(shape) != g.numel():
            raise ProblemError(f"{name}.vjp returned shape {tuple(shape)}; the cotangent has shape {tuple(g.shape)}")
        if tuple(shape) != tuple(g.shape):
            gx = gx.reshape(tuple(g.shape))
    if wanted:
        if not isinstance(gp, dict):
            raise ProblemError(f"{name}.parameter_vjp returned {type(gp).__name__}, not a dict of gradients by "
                               f"parameter name")
        params = S.parameters()
        lead = () if groups is None else (groups,)
        for k in wanted:
            v = gp.get(k)
            want = (*lead, *params[k].shape)
            if k not in gp:
                raise ProblemError(f"{name}.parameter_vjp returned no gradient for {k!r} (asked for {wanted})")
            if not isinstance(v, kind):
                raise ProblemError(f"{name}.parameter_vjp returned {type(v).__name__} for {k!r} (asked for "
                                   f"{wanted}); it was given its cotangent as {kind.__module__}.{kind.__name__} "
                                   f"and must return the gradients as such")
            if tuple(v.shape) != want:
                raise ProblemError(f"{name}.parameter_vjp returned shape {tuple(v.shape)} for {k!r}; the "
                                   f"parameter has shape {tuple(params[k].shape)}"
                                   + (f" ({groups} groups: {want})" if groups is not None else ""))
    return gx, gp


def _vjp_x(S: Projector, res: Any, g: torch.Tensor) -> torch.Tensor:
    g = g.contiguous()
    res = _unfold(res, g)
    if g.shape[0] == 0:
        return torch.zeros_like(g)
    with torch.no_grad(), small_work(g.device.type == "cpu", _work(g, S)):
        return _backward_parts(S, res, g, (), True)[0]


def _vjp_outputs(gy: torch.Tensor, S: Projector, res: Any, wanted: tuple[str, ...], need_x: bool,
                 groups: int | None = None) -> tuple[torch.Tensor, ...]:
    """``(J g, *data gradients)``: the forward of :class:`_VJP` (and of :class:`_GroupedVJP`, ``groups``)."""
    g = gy.contiguous()
    res = _unfold(res, g)
    if g.shape[0] == 0:
        params = S.parameters()
        lead = () if groups is None else (groups,)
        return (torch.zeros_like(g), *[params[k].new_zeros((*lead, *params[k].shape)) for k in wanted])
    with torch.no_grad(), small_work(g.device.type == "cpu", _work(g, S)):
        gx, gp = _backward_parts(S, res, g, wanted, need_x, groups=groups)
    return (torch.zeros_like(g) if gx is None else gx, *[gp[k] for k in wanted])


class _VJP(torch.autograd.Function):
    """The backward of :class:`_Project` as a function of the output gradient (so that it can be vmapped).

    ``params``: the set's differentiable data, inputs so that a transform (or eager autograd) outside the one
    that ran the backward sees that ``J g`` and the data gradients depend on them: differentiating them there
    (a second derivative through the data) is refused, as with ``create_graph`` (:class:`_VJPGraph`); without
    them as inputs ``jacrev(jacrev(f))`` in the data returned zeros.
    """

    @staticmethod
    def forward(gy, S, res, wanted, need_x, *params):
        return _vjp_outputs(gy, S, res, wanted, need_x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.set, ctx.result, ctx.wanted, ctx.need_x = inputs[1:5]
        ctx.save_for_backward(*inputs[5:])
        ctx.set_materialize_grads(False)  # an output that takes no part comes as None: only used ones are judged

    @staticmethod
    def backward(ctx, *grads):  # J is symmetric: the derivative of g -> J g is J
        _refuse_second_order_in_data(_data_reached(ctx, 5), grads[1:])
        params = ctx.saved_tensors
        gx = None if grads[0] is None else _jvp_again(ctx, grads[0], params)
        return (gx, None, None, None, None, *([None] * len(params)))

    @staticmethod
    def jvp(ctx, gy_t, *tangents):  # every output is linear in gy: its tangent is the same product of gy's tangent
        _refuse_forward_through_data(ctx.set, ctx.wanted, tangents[4:])
        return _VJP.apply(gy_t, ctx.set, ctx.result, ctx.wanted, ctx.need_x)

    @staticmethod
    def vmap(info, in_dims, gy, S, res, wanted, need_x, *params):
        """Map the backward over one vmap level.

        A level the forward folded into the batch (per-sample gradients: ``vmap(grad(f))``) is folded the
        same way, slice ``v`` on rows ``v N .. (v+1) N`` of the result (and of a tiled per-point parameter's
        gradient), a level it projected slice by slice (:class:`_Sliced`) slice by slice; any other level
        (``jacrev``'s basis vectors) maps whole cotangents, one call each.
        """
        gb = gy.movedim(in_dims[0], 0)
        level = torch._C._functorch.maybe_current_level()
        if isinstance(res, _Sliced) and res.level == level and len(res.parts) == gb.shape[0]:
            outs = [_VJP.apply(gb[v], S, part, wanted, need_x, *params) for v, part in enumerate(res.parts)]
        elif isinstance(res, _Folded) and res.level == level and res.size == gb.shape[0]:
            V, N, rest = res.size, res.rows, res.inner
            flat = gb.reshape(V * N, *gb.shape[2:])
            # S is the folded set: its per-point parameters were tiled, slice v's own on rows v N .. (v+1) N
            per_point = _per_point_names(S) or ()
            if all(k in per_point for k in wanted):  # J block diagonal, a per-point gradient its point's: one product
                out = _VJP.apply(flat, S, rest, wanted, need_x, *params)
                return tuple(o.reshape(V, N, *o.shape[1:]) for o in out), tuple(0 for _ in out)
            if isinstance(S, Polyhedral):  # shared data: each slice's gradient summed over its own rows
                out = _GroupedVJP.apply(flat, S, rest, wanted, need_x, V, *params)
                return (out[0].reshape(gb.shape), *out[1:]), tuple(0 for _ in out)
            outs = []  # other sets: each slice alone (the others' cotangent zero)
            for v in range(V):
                part = torch.zeros_like(flat)
                part[v * N:(v + 1) * N] = gb[v]
                o = _VJP.apply(part, S, rest, wanted, need_x, *params)
                grads = (g[v * N:(v + 1) * N] if k in per_point else g for k, g in zip(wanted, o[1:], strict=True))
                outs.append((o[0].reshape(gb.shape)[v], *grads))
        elif gb.shape[0] == 0:  # no cotangents (jacrev of an empty output): empty products of the right shapes
            one = _VJP.apply(gb.new_zeros(gb.shape[1:]), S, res, wanted, need_x, *params)
            stacked = tuple(o.new_zeros((0, *o.shape)) for o in one)
            return stacked, tuple(0 for _ in stacked)
        else:
            outs = [_VJP.apply(gb[v], S, res, wanted, need_x, *params) for v in range(gb.shape[0])]
        stacked = tuple(torch.stack(parts) for parts in zip(*outs, strict=True))
        return stacked, tuple(0 for _ in stacked)


class _GroupedVJP(torch.autograd.Function):
    """:class:`_VJP` of a folded vmap level onto shared polyhedral data: one backward for all the slices.

    ``J`` is block diagonal over the samples and each data gradient a sum of per-sample terms, so one pass
    gives ``J g`` for every slice and, summed over each slice's rows, every slice's data gradients
    (``groups`` = the slices).
    """

    @staticmethod
    def forward(gy, S, res, wanted, need_x, groups, *params):
        return _vjp_outputs(gy, S, res, wanted, need_x, groups)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.set, ctx.result = inputs[1], inputs[2]
        ctx.save_for_backward(*inputs[6:])
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, *grads):
        _refuse_second_order_in_data(_data_reached(ctx, 6), grads[1:])
        params = ctx.saved_tensors
        gx = None if grads[0] is None else _jvp_again(ctx, grads[0], params)
        return (gx, None, None, None, None, None, *([None] * len(params)))


_SECOND_ORDER_IN_DATA = (
    "second derivatives through the constraint data (the derivative of J v with respect to them, or of their "
    "gradient) are not supported: detach the learned constraint data in the part of the loss that is "
    "differentiated twice")


def _moving_with_x(S: Projector, wanted: tuple[str, ...]) -> tuple[str, ...]:
    """The data gradients among ``wanted`` that depend on x beyond the active set.

    J g and the gradients of the right-hand sides and bounds are linear in g with coefficients fixed by the active
    set (piecewise constant in x); those of the matrices, ``−λ (J g)ᵀ − r yᵀ``, carry λ(x) and y(x); a third
    party's are unknown. A forward-mode derivative in x of the former is the product of g's tangent; of the
    latter it is not implemented.
    """
    if third_party(S):
        return wanted
    return tuple(k for k in wanted if k in ("A", "B"))


def _refuse_forward_through_data(S: Projector, wanted: tuple[str, ...], data_tangents: tuple[Any, ...],
                                 x_tangent: Any = None, gy_tangent: Any = True) -> None:
    """Refuse a forward-mode derivative of the backward's outputs that is not the product of g's tangent.

    Tangents on the data (a second derivative through them), and a tangent of g or x reaching a data gradient
    that moves with x (:func:`_moving_with_x`: jacfwd in x of the gradient with respect to A was silently wrong).
    """
    if any(t is not None for t in data_tangents):
        raise ProblemError(_SECOND_ORDER_IN_DATA)
    moving = _moving_with_x(S, wanted)
    if moving and (gy_tangent is not None or x_tangent is not None):
        raise ProblemError(f"forward-mode derivatives (jacfwd, jvp, forward_ad) of the gradient with respect to "
                           f"{', '.join(moving)} are not supported (it depends on x through the multipliers and the "
                           "projection, not only through g): detach the learned constraint data in the part of the "
                           "loss that is differentiated twice; for derivatives in x alone use torch.func (jvp or "
                           "jacfwd of grad, hessian) or torch.autograd.functional.hvp, which leave the data out")


def _refuse_second_order_in_data(need_params: tuple[bool, ...], data_grads: tuple[Any, ...]) -> None:
    """Refuse a backward's products differentiated with respect to the data, or its data gradients differentiated.

    Neither derivative is implemented; leaving them out would be silently wrong (a ProblemError instead).
    """
    if any(need_params) or any(g is not None for g in data_grads):
        raise ProblemError(_SECOND_ORDER_IN_DATA)


def _data_reached(ctx: Any, first: int) -> tuple[bool, ...]:
    """Which of the data (inputs ``first`` on, saved as ``ctx.saved_tensors``) this backward pass differentiates.

    Eager: the data that need a gradient and whose gradient node the running pass executes (a derivative in x
    alone of a layer with learned data, ``torch.autograd.grad(g, x)``, reaches none); under a torch.func
    transform: those the transform's level tracks (``needs_input_grad``).
    """
    need = ctx.needs_input_grad[first:]
    if torch._C._are_functorch_transforms_active():
        return tuple(need)
    return tuple(nd and _reached(p) for nd, p in zip(need, ctx.saved_tensors, strict=True))


def _jvp_again(ctx: Any, g: torch.Tensor, params: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
    """``J g``: the derivative of ``v -> J v`` (J symmetric), itself a Function under torch.func transforms.

    Under ``jacrev(jacrev(f))`` or ``hessian`` the cotangent carries the outer transforms' levels (a batched
    or grad-tracking tensor): the product goes through :class:`_VJP`, whose vmap rule maps it (with the data
    ``params``, whose derivative an outer level may not take).
    """
    if torch._C._are_functorch_transforms_active() or (torch.is_grad_enabled() and g.requires_grad):
        return _VJP.apply(g, ctx.set, ctx.result, (), True, *params)[0]  # (create_graph: in the graph too)
    return _vjp_x(ctx.set, ctx.result, g)


class _VJPGraph(torch.autograd.Function):
    """:class:`_VJP` in a graph of the backward (``create_graph=True``), with ``x`` and the data as inputs.

    ``J`` is piecewise constant in ``x``: the derivative of ``J g`` with respect to ``x`` is zero (almost
    everywhere, as for ``relu``), so a gradient penalty's graph reaches ``x``. Its derivative with respect
    to the constraint data is not zero and is not implemented: asking for it (the data require grad and
    the second derivative reaches them) raises, rather than leaving it out of their gradients.
    """

    @staticmethod
    def forward(gy, S, res, wanted, need_x, x, *params):
        return _VJP.forward(gy, S, res, wanted, need_x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.set, ctx.result, ctx.x_shape = inputs[1], inputs[2], tuple(inputs[5].shape)
        ctx.wanted, ctx.need_x = inputs[3], inputs[4]
        ctx.x_dtype, ctx.x_device = inputs[5].dtype, inputs[5].device
        ctx.save_for_backward(*inputs[6:])
        # inputs without a tangent reach jvp as None, not as zeros read as tangents on the data (forward-over-reverse
        # in x was refused on a layer with learned a, b or bounds); unused outputs reach backward as None
        ctx.set_materialize_grads(False)

    @staticmethod
    def jvp(ctx, gy_t, *tangents):  # J piecewise constant in x: the tangent is the product of gy's (or zero)
        _refuse_forward_through_data(ctx.set, ctx.wanted, tangents[5:], x_tangent=tangents[4], gy_tangent=gy_t)
        if gy_t is None:
            gy_t = torch.zeros(ctx.x_shape, dtype=ctx.x_dtype, device=ctx.x_device)
        return _VJP.apply(gy_t, ctx.set, ctx.result, ctx.wanted, ctx.need_x)

    @staticmethod
    def backward(ctx, *grads):
        return _legacy_batching_guard(ctx, grads[0], _VJPGraph._backward, *grads)

    @staticmethod
    def _backward(ctx, *grads):
        need = ctx.needs_input_grad
        data_grads = [g for g in grads[1:] if g is not None and bool((g != 0).any())]
        # data that require grad but that this backward does not reach (torch.autograd.grad(..., x): a
        # derivative in x alone) take no part: only a pass that reaches them is refused
        _refuse_second_order_in_data(_data_reached(ctx, 6), tuple(data_grads))
        # J grads[0]: a function of the cotangent in a graph (create_graph: the double-backward trick of
        # torch.autograd.functional.hvp differentiates it with respect to grads[0])
        gx = (_jvp_again(ctx, grads[0], ctx.saved_tensors) if need[0] and grads[0] is not None else
              torch.zeros(ctx.x_shape, dtype=ctx.x_dtype, device=ctx.x_device) if need[0] else None)
        zx = torch.zeros(ctx.x_shape, dtype=ctx.x_dtype, device=ctx.x_device) if need[5] else None
        return (gx, None, None, None, None, zx, *([None] * (len(need) - 6)))


def _reached(t: torch.Tensor) -> bool:
    """Whether the running backward pass will execute ``t``'s gradient node (True where torch cannot say)."""
    try:
        return bool(torch._C._will_engine_execute_node(torch.autograd.graph.get_gradient_edge(t).node))
    except (AttributeError, RuntimeError):  # an older torch, or a pass it cannot judge: taken as reached
        return True


def _flatten(x: torch.Tensor, S: Projector) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """``x`` as (batch, n): returns it with the batch shape and the event shape to restore."""
    ev = S.checked_event_shape()
    if tuple(x.shape[-len(ev):]) == ev:
        bshape, tail = tuple(x.shape[: x.ndim - len(ev)]), ev
    elif x.shape[-1] == S.n:
        bshape, tail = tuple(x.shape[:-1]), (S.n,)
    else:
        raise ProblemError(f"x must have shape (..., {S.n})" + (f" or (..., *{ev})" if ev != (S.n,) else "")
                           + f" to match the set, got {tuple(x.shape)}")
    N = int(np.prod(bshape)) if bshape else 1
    return x.reshape(N, S.n), bshape, tail


def _refuse_meta(tensors: dict[str, Any]) -> None:
    """A tensor on the 'meta' device has a shape but no values: a ProblemError naming it, not torch's own."""
    for name, v in tensors.items():
        if isinstance(v, torch.Tensor) and v.is_meta:
            raise ProblemError(f"{name} is on the 'meta' device: it has a shape but no values to project with")


def _refuse_inference(tensors: dict[str, Any]) -> None:
    """Constraint data made under ``torch.inference_mode`` that require grad, used outside it: a ProblemError.

    Autograd cannot record an inference tensor outside inference mode (torch's own error came from deep in the
    validation: "abs(): functions with out=... arguments don't support automatic differentiation").
    """
    if torch.is_inference_mode_enabled():
        return
    bad = [k for k, v in tensors.items() if isinstance(v, torch.Tensor) and v.is_inference() and v.requires_grad]
    if bad:
        raise ProblemError(f"the constraint data {', '.join(bad)} are inference tensors (made under "
                           "torch.inference_mode) that require grad: autograd cannot record them outside inference "
                           "mode. Create them (build the ProjectionLayer) outside torch.inference_mode, or replace "
                           f"each by a copy made outside it (layer.{bad[0]} = "
                           f"torch.nn.Parameter(layer.{bad[0]}.clone()))")


def _refuse_unpolished(settings: dict, S: Any = None) -> None:
    """``polish=False`` (a setting, or a Polyhedral set built with it) is refused: a SettingsError.

    The adapter's outputs are the polished exact projections (feasible to rounding whatever the backend's
    tolerance) and its backward the HS-Jacobian of their verified faces; without the polish an output is the
    backend's point at its tolerance, off the projection by as much (1.4e-2 at the IPM's ``eps_abs=1e-3``) with
    the gradient of a guessed face (zero where it is 1), silently; ``pp.project(..., polish=False)`` gives it.
    """
    p, whose = settings.get("polish", True), ""
    if isinstance(S, Polyhedral) and not S.options.polish:
        p, whose = False, " (the Polyhedral set's)"
    if not (isinstance(p, (bool, np.bool_)) and p):
        raise SettingsError(f"polish={p!r}{whose} is not a setting of the torch adapter: its outputs are the polished "
                            "exact projections and its backward differentiates their verified faces; "
                            "pp.project(..., polish=False) gives a backend's raw answer (not differentiable)")


def _tracer(x: Any) -> str | None:
    """The graph tracer recording ``x`` now, by name; None where the projection runs on values.

    The forward reads x's values (NumPy, the solvers): a tracer that runs it on placeholders or records it as a
    graph cannot. ``torch.jit.trace``, ``torch.export`` (fake / functional tensors), ``make_fx`` (a proxy dispatch
    mode: ``torch.func.linearize`` traces with it), ``torch.func.functionalize`` (no functionalisation rule for a
    custom autograd.Function) and ``torch.fx.symbolic_trace`` (a Proxy for x): named here, since their own errors
    arise inside autograd.Function or a ``.item()`` and name neither the tracer nor the layer.
    """
    if isinstance(x, torch.fx.Proxy):
        return "torch.fx.symbolic_trace"
    if not isinstance(x, torch.Tensor):
        return None
    exporting = getattr(torch.compiler, "is_exporting", lambda: False)
    if torch.jit.is_tracing() or exporting():
        return "torch.jit.trace and torch.export"
    key = getattr(torch._C, "_TorchDispatchModeKey", None)
    if key is not None and torch._C._get_dispatch_mode(key.PROXY) is not None:
        return "make_fx (and torch.func.linearize, which traces with it)"
    if type(x).__name__ in ("FakeTensor", "FunctionalTensor"):
        return "torch.jit.trace and torch.export (fake and functional tensors)"
    functionalize = getattr(_ft.TransformType, "Functionalize", None)
    stack = getattr(_ft, "get_interpreter_stack", lambda: None)() or ()
    if functionalize is not None and any(level.key() == functionalize for level in stack):
        return "torch.func.functionalize"
    return None


def _check_x(x: Any) -> torch.Tensor:
    tracer = _tracer(x)
    if tracer is not None:
        raise ProblemError(f"{tracer} cannot record the projection layer (its forward runs solvers outside torch, on "
                           "the values of x); torch.compile works (the layer is a graph break), and so do "
                           "torch.func's vmap, grad, vjp, jvp, jacrev, jacfwd and hessian")
    if not isinstance(x, torch.Tensor):
        raise ProblemError(f"x must be a torch.Tensor, got {type(x).__name__}")
    _refuse_meta({"x": x})
    if x.is_nested:
        raise ProblemError("x is a nested tensor: the projection takes one tensor of points (..., n); project each "
                           "component, or pad / stack them into one tensor")
    if x.layout != torch.strided:  # sparse (COO, CSR, ...): used dense, as sparse constraint data are (_dense)
        x = x.to_dense()
    if x.dtype not in (torch.float32, torch.float64):
        raise ProblemError(f"x must be float32 or float64, got {x.dtype}")
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ProblemError(f"x must have shape (..., n) with n >= 1, got {tuple(x.shape)}")
    return x


def _polyhedral_from_tensors(x: torch.Tensor, parts: dict[str, Any], backend: str, settings: dict) -> Polyhedral:
    """A :class:`Polyhedral` set from constraint tensors shared by x's batch or carrying its batch dimensions.

    Shared constraint tensors that need no gradient are looked up in :data:`_SETS` first (a layer called
    with the same data every step validates them, fills in the missing parts and sets up its backend once).
    """
    key = _SETS.key(x, parts, backend, settings)
    hit = _SETS.get(key, parts) if key is not None else None
    if hit is not None:
        return hit
    if key is not None:  # the set holds copies: what the caller changes in place later cannot reach it
        # made outside any torch.func transform: a copy made inside one is wrapped at its level and escapes
        # it in the cache (the next call's comparison failed an internal assert of torch)
        with torch._C._DisableFuncTorch():
            parts = {k: None if v is None else v.detach().clone() for k, v in parts.items()}
    bshape = tuple(x.shape[:-1])
    x2 = x.reshape(-1, x.shape[-1]) if x.ndim > 1 else x.reshape(1, -1)
    data, given = polydata_from_arrays(x2, **parts, batch_shape=bshape)
    S = Polyhedral(data, backend, given=given, batch_shape=bshape if data.batched else (), **settings)
    if key is not None and not data.batched:
        _SETS.put(key, parts, S)
    return S


class _SetCache:
    """The sets built from recent constraint tensors, reused only when every tensor is *equal* to the stored copy.

    Looked up by the tensors' identities, confirmed by their contents (``torch.equal`` against the copies
    the set was built from), so an in-place change of the data — through ``.data`` too, which torch's
    version counter does not see — is a miss, never a stale answer. Tensors that require grad are not
    cached (the autograd graph must reach the caller's tensors), nor per-sample (batched) data. LRU of
    :attr:`SIZE` entries, thread-safe.
    """

    SIZE = 8

    def __init__(self) -> None:
        import threading
        from collections import OrderedDict

        self._lock = threading.Lock()
        self._items: OrderedDict[tuple, tuple[dict[str, torch.Tensor], Polyhedral]] = OrderedDict()

    @staticmethod
    def key(x: torch.Tensor, parts: dict[str, Any], backend: str, settings: dict) -> tuple | None:
        """The lookup key, or None when these data are not cached."""
        ids = []
        for k in PARTS:
            v = parts[k]
            if v is None:
                ids.append(None)
                continue
            if not isinstance(v, torch.Tensor) or _differentiated(v) or v.ndim > (2 if k in ("A", "B") else 1):
                return None
            ids.append((id(v), tuple(v.shape), v.dtype, str(v.device)))
        try:
            # the registry's generation: a name registered again or removed since stands for another backend
            key = (tuple(ids), x.dtype, str(x.device), x.shape[-1], backend, registry.generation,
                   tuple(sorted(settings.items())))
            hash(key)
        except TypeError:  # unhashable settings: no caching
            return None
        return key

    def get(self, key: tuple, parts: dict[str, Any]) -> Polyhedral | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            copies, S = hit
            if not all(torch.equal(copies[k], parts[k]) for k in copies):
                del self._items[key]
                return None
            self._items.move_to_end(key)
            return S

    def put(self, key: tuple, copies: dict[str, Any], S: Polyhedral) -> None:
        """Keep ``S``, built from ``copies`` (the caller's tensors cloned)."""
        copies = {k: v for k, v in copies.items() if v is not None}
        with self._lock:
            self._items[key] = (copies, S)
            while len(self._items) > self.SIZE:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


#: the sets of the constraint tensors given to :func:`project` and :class:`ProjectionLayer` lately
_SETS = _SetCache()


def _after_fork_in_child() -> None:
    # a lock held by another thread at the fork is never released in the child (its first layer call hung)
    import threading

    _SETS._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@_eager_under_compile
def project(x: torch.Tensor, S: Any = None, a: Any = None, B: Any = None, b: Any = None, lb: Any = None,
            ub: Any = None, *, A: Any = None, backend: str = "auto", structured: bool = True,
            **settings: Any) -> torch.Tensor:
    """Differentiable exact projection ``Π_S(x)``.

    Parameters
    ----------
    x : (..., n) tensor, float32 or float64
    S : Projector, Polyhedron, or the tensor A
        The set. Alternatively the constraint data ``A, a, B, b, lb, ub`` (positionally from here, or as
        keywords): ``A (m, n)``, ``a (m,)`` — or with the batch dimensions of x (input-dependent
        constraints), ``B, b`` likewise, ``lb, ub (n,)`` or batched; ``±inf`` allowed in bounds. Tensors
        must have x's dtype (else a ProblemError); NumPy arrays, lists and numbers are taken in x's dtype.
    backend : str
        Polyhedra only: ``"auto"`` (:func:`polyproj.backends.defaults.auto_projection`: the ADMM start
        for shared matrices, the batched IPM for per-sample ones), ``"admm"``, ``"ipm"`` or any
        registered backend.
    structured : bool
        A Polyhedron that is a structured set (:mod:`polyproj.sets.detect`) is projected by that set
        when ``backend="auto"`` and no settings are given (default True).
    **settings
        Polyhedra only: ``tol`` (polish KKT tolerance, default 1e-9), ``max_polish_iter``,
        ``polish_block_iter``, ``fallback`` (backend for what a start-only backend leaves), and backend
        settings (``eps_abs``, ``max_iter``, ..., and backend options such as the ADMM's ``rho``).
        ``polish=False`` is refused (SettingsError): the outputs are the polished exact projections.

    Returns
    -------
    (..., n) tensor in the dtype and on the device of x
        Differentiable with respect to x and the constraint tensors (HS-Jacobian).

    Raises
    ------
    ProblemError
        Shapes, NaN/inf, mismatched device or dtype.
    InfeasibleError
        The polyhedron is empty.

    Examples
    --------
    >>> import torch, polyproj as pp
    >>> from polyproj.adapters.torch import project
    >>> x = torch.tensor([[0.9, 0.5, -1.0]], dtype=torch.float64, requires_grad=True)
    >>> y = project(x, pp.sets.Simplex(3))
    >>> y.detach().numpy().round(12)
    array([[0.7, 0.3, 0. ]])
    >>> y[0, 0].backward(); x.grad
    tensor([[ 0.5000, -0.5000,  0.0000]], dtype=torch.float64)
    """
    check_flags(structured=structured)
    y, _ = _project(x, S, dict(A=A, a=a, B=B, b=b, lb=lb, ub=ub), backend, settings, None, structured)
    return y


_SET_AND_DATA = "give either a set S or the constraint data A, a, B, b, lb, ub, not both"
_A_TWICE = "A is given twice, positionally and as A=: give it once"


def _project(x: Any, S: Any, parts: dict, backend: str, settings: dict, warm: Any,
             structured: bool = True) -> tuple[torch.Tensor, Any]:
    """:func:`project` with a warm start; returns the projection and the result (for the next warm start)."""
    x = _check_x(x)
    _refuse_meta(dict(parts, S=None, A=S if isinstance(S, torch.Tensor) else parts["A"]))  # a tensor S is A
    _refuse_inference(dict(parts, A=S if isinstance(S, torch.Tensor) else parts["A"]))
    _refuse_unpolished(settings, S)
    a, B, b, lb, ub, A = (parts[k] for k in ("a", "B", "b", "lb", "ub", "A"))
    forward: tuple[str, ...] = ()
    if isinstance(S, (Projector, Polyhedron)):
        if any(v is not None for v in (a, B, b, lb, ub, A)):
            raise ProblemError(_SET_AND_DATA)
        if isinstance(S, Polyhedron):
            found = recognise(S) if structured and backend == "auto" and not settings else None
            S = found if found is not None else Polyhedral(S, backend, **settings)
        elif settings or backend != "auto":
            raise ProblemError(f"{type(S).__name__} carries its own method: backend and settings do not apply")
        x2, bshape, tail = _flatten(x, S)
        # the set's own tensors a forward-mode derivative is taken of (a per-sample total): through the
        # Function, whose jvp refuses them, rather than read as constants (a silent zero tangent)
        forward = tuple(k for k, v in S.parameters().items() if isinstance(v, torch.Tensor) and _differentiated(v))
    else:
        if S is not None and A is not None:  # A given twice (positionally and as A=): one was silently dropped
            raise ProblemError(_A_TWICE)
        A = S if S is not None else A
        lb, ub = (_scalar_bound(v, x) for v in (lb, ub))
        parts = {k: _dense(v) for k, v in dict(A=A, a=a, B=B, b=b, lb=lb, ub=ub).items()}
        if any(is_vmapped(v) for v in parts.values()):
            raise ProblemError("torch.func.vmap over constraint tensors is not supported: give the tensors a "
                               "batch dimension instead (per-sample constraints)")
        S = _polyhedral_from_tensors(x, parts, backend, settings)
        x2, bshape, tail = _flatten(x, S)
        # the caller's tensors a forward-mode derivative is taken of (they carry no requires_grad)
        forward = tuple(k for k, v in parts.items() if isinstance(v, torch.Tensor) and _differentiated(v))
    y, res = _apply(x2, S, warm, forward)
    return y.reshape(*bshape, *tail), res


def _scalar_bound(v: Any, x: torch.Tensor) -> Any:
    """A scalar bound (a number or a 0-d tensor) as the same bound on every coordinate of ``x``.

    A 0-d tensor is expanded (a view: its gradient is the sum over the coordinates); anything else is
    returned as it is, for the shape checks.
    """
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
        return _constant_bound(float(v), x.shape[-1], x.dtype, x.device)
    if isinstance(v, torch.Tensor) and v.ndim == 0:
        return v.expand(x.shape[-1])
    return v


@functools.lru_cache(maxsize=32)
def _constant_bound(value: float, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The bound ``value`` on each of ``n`` coordinates, one tensor per (value, n, dtype, device).

    The same tensor every call, so that the set cache (keyed by the tensors' identities) finds the set again: a
    new tensor per call rebuilt and validated the set each time (22 ms against 13.5 at n 50, m 100) and filled the
    cache with dead entries. Made outside any torch.func transform (a tensor made inside one is wrapped, and a
    wrapped constraint tensor is taken for one being differentiated: jacfwd refused lb=-1.0). Nothing writes it.
    """
    with torch._C._DisableFuncTorch():
        return torch.full((n,), value, dtype=dtype, device=device)


def _dense(v: Any) -> Any:
    """Sparse constraint data made dense (a torch COO/CSR tensor strided, a SciPy sparse matrix an array).

    The layer works on dense data. ``to_dense`` is differentiable: a learned sparse tensor gets the
    gradient on its sparsity pattern (torch's rule for sparse leaves), the dense gradient's entries there.
    """
    if isinstance(v, torch.Tensor):
        return v.to_dense() if v.layout != torch.strided else v
    return v.toarray() if sp.issparse(v) else v


def _differentiated(t: torch.Tensor) -> bool:
    """True for a caller's tensor a derivative may be taken of.

    ``requires_grad``, a ``torch.func`` transform's wrapped tensor, or a forward-mode dual tensor: the
    Function must see it (and its ``jvp`` refuses it).
    """
    if t.requires_grad or torch._C._functorch.is_functorch_wrapped_tensor(t):
        return True
    return _forward_ad._current_level >= 0 and _forward_ad.unpack_dual(t).tangent is not None


def _apply(x2: torch.Tensor, S: Projector, warm: Any, forward: tuple[str, ...] = ()) -> tuple[torch.Tensor, Any]:
    """The Function on a (batch, n) tensor: the projection and its result (for a later warm start)."""
    # only the data that need a gradient go through the Function: the set is then used as it is (its
    # conversions of the data kept from call to call) unless some part is learned
    params = {k: v for k, v in S.parameters().items() if isinstance(v, torch.Tensor) and (v.requires_grad
                                                                                     or k in forward)}
    y, res, _ = _Project.apply(x2, S, _Config(tuple(params), warm), *params.values())
    return y, res


# ----------------------------------------------------------------------------- the Module
def _version(t: torch.Tensor) -> int | None:
    """The version counter of ``t``; None for an inference tensor.

    A tensor made under ``torch.inference_mode`` has none and cannot be changed in place outside that mode
    (its contents are still compared).
    """
    return None if t.is_inference() else t._version


def _validated(host: dict[str, Any], dependent: bool) -> Polyhedron:
    """The layer's data (host arrays by part) as a validated :class:`~polyproj.problem.Polyhedron`.

    Bounds that cross (``lb > ub``, each valid on its own) are an empty polyhedron: an InfeasibleError, as on
    :func:`project`'s path (:func:`~polyproj.sets.polyhedral.polydata_from_arrays`), not the Polyhedron's
    ProblemError.
    """
    try:
        return Polyhedron(**host, allow_dependent_rows=dependent)
    except ProblemError:
        if host.get("lb") is None or host.get("ub") is None:
            raise
        # the data validated with one bound at a time: any other error is raised as the Polyhedron words it
        lo = Polyhedron(**dict(host, ub=None), allow_dependent_rows=dependent).lb
        hi = Polyhedron(**dict(host, lb=None), allow_dependent_rows=dependent).ub
        bad = np.flatnonzero(lo > hi) if lo.shape == hi.shape else ()  # (shapes that disagree: the error raised)
        if not len(bad):
            raise
        i = int(bad[0])
        raise InfeasibleError(f"lb[{i}] = {lo[i]:g} > ub[{i}] = {hi[i]:g} ({len(bad)} such coordinates): the bounds "
                              "cross, so the polyhedron is empty") from None


class ProjectionLayer(nn.Module):
    """``nn.Module`` projecting its input onto a set.

    Parameters
    ----------
    S : Projector or Polyhedron, optional
        The set; alternatively the constraint data ``A, a, B, b, lb, ub`` (positionally from here or as
        keywords: array-likes or tensors, validated as a :class:`~polyproj.problem.Polyhedron`: shapes,
        NaN, B of full row rank), **copied** into buffers (moved by ``.to()``, saved in ``state_dict``).
    learn : iterable of str
        Names among ``A, a, B, b, lb, ub`` to store as ``nn.Parameter`` (learned constraints); each must
        be given.
    dtype : torch.dtype
        Storage dtype of the constraint data (default float64).
    backend : str
        As in :func:`project` (polyhedra).
    warm_start : bool
        Polyhedra: start each call from the previous call's active sets (a batch of the same size, e.g.
        full-batch training or a fixed set of inputs). Small CPU batches (the direct path) take each
        point's guessed face where the KKT conditions verify it and solve only the others; larger batches
        start the polish from the guesses, and samples it cannot verify in a few rounds go through the
        whole pipeline. Either way the answer is the same exact projection.
    structured : bool
        Constraint data (nothing learned) that describe a structured set are projected by that set
        (:mod:`polyproj.sets.detect`), as in :func:`project`.
    allow_dependent_rows : bool
        Accept equality rows ``B`` that are linearly dependent (consistent ones: a set whose structure implies
        them, e.g. all the row and column sums of the Birkhoff polytope), as :func:`project` does; by default
        the layer validates B of full row rank (:class:`~polyproj.problem.Polyhedron`) and names them.
    **settings
        As in :func:`project` (``polish=False`` is refused: the outputs are the polished exact projections).

    Examples
    --------
    >>> import torch
    >>> from polyproj.adapters.torch import ProjectionLayer
    >>> layer = ProjectionLayer(B=[[1.0, 1.0, 1.0]], b=[1.0], lb=[0.0, 0.0, 0.0])
    >>> layer.set.inner  # recognised: the simplex, projected by its exact method
    Simplex(n=3, total=1)
    >>> ProjectionLayer(B=[[1.0, 1.0, 1.0]], b=[1.0], lb=[0.0, 0.0, 0.0], structured=False)
    ProjectionLayer(n=3, inequalities=0, equalities=1, lower bounds=3, upper bounds=0, backend='auto')
    >>> layer(torch.tensor([[2.0, 0.0, 0.0]], dtype=torch.float64))
    tensor([[1., 0., 0.]], dtype=torch.float64)
    """

    def __init__(self, S: Any = None, a: Any = None, B: Any = None, b: Any = None, lb: Any = None, ub: Any = None,
                 *, A: Any = None, learn: tuple[str, ...] | list[str] = (), dtype: torch.dtype = torch.float64,
                 backend: str = "auto", warm_start: bool = False, structured: bool = True,
                 allow_dependent_rows: bool = False, **settings: Any) -> None:
        super().__init__()
        if dtype not in (torch.float32, torch.float64):
            raise ProblemError(f"dtype must be torch.float32 or torch.float64 (the constraint data's storage, the "
                               f"dtypes the projection computes in), got {dtype!r}")
        check_flags(warm_start=warm_start, structured=structured, allow_dependent_rows=allow_dependent_rows)
        self.warm_start, self._last = bool(warm_start), None
        if isinstance(learn, str):  # one name, not its letters
            learn = (learn,)
        try:  # materialised once: an iterator was consumed by the check below, and nothing was learned
            learn = tuple(learn)
            unknown = set(learn) - set(PARTS)
        except TypeError:
            raise ProblemError(f"learn takes an iterable of names among {PARTS}, got {learn!r}") from None
        if unknown:
            raise ProblemError(f"learn takes names among {PARTS}, got {sorted(unknown, key=str)}")
        _refuse_unpolished(settings)
        self.backend, self.settings = backend, settings
        if isinstance(S, Projector):  # a Polyhedral too: a fixed set with its own backend
            if learn or any(v is not None for v in (a, B, b, lb, ub, A)):
                raise ProblemError(f"{type(S).__name__} has no constraint data to learn or give"
                                   + ("; to learn them give its Polyhedron or the tensors A, a, B, b, lb, ub"
                                      if isinstance(S, Polyhedral) else ""))
            if backend != "auto" or settings or allow_dependent_rows:
                raise ProblemError(f"{type(S).__name__} carries its own method: backend and settings do not apply")
            _refuse_unpolished({}, S)
            self.set, self.n = S, S.n
            self._own(S)
            return
        self._dependent = bool(allow_dependent_rows) or (isinstance(S, Polyhedron) and S.allow_dependent_rows)
        if isinstance(S, Polyhedron):
            if any(v is not None for v in (a, B, b, lb, ub, A)):
                raise ProblemError(_SET_AND_DATA)
            vals = dict(zip(PARTS, (S.A_dense, S.a, S.B_dense, S.b, S.lb, S.ub), strict=True))
            vals = {k: v for k, v in vals.items() if (k not in ("A", "a", "B", "b") or np.size(v))}
        else:
            if S is not None and A is not None:
                raise ProblemError(_A_TWICE)
            vals = dict(zip(PARTS, (S if S is not None else A, a, B, b, lb, ub), strict=True))
        self.set = None
        P = self._store(vals, learn, dtype)
        if backend != "auto" or settings:
            Polyhedral(P, backend, **settings)  # the backend and settings checked now, not at the first call
        self._recognising = structured and not learn and backend == "auto" and not settings
        if self._recognising:
            self.set = recognise(P)  # a structured set: its exact method (the buffers stay for state_dict)
            self._seen = self._buffer_state()

    def _store(self, vals: dict[str, Any], learn: Any, dtype: torch.dtype) -> None:
        _refuse_meta(vals)
        dense = {k: _dense(v) for k, v in vals.items()}  # stored dense, copied to the layer's dtype below
        host = {k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v) for k, v in dense.items()}
        missing = [k for k in learn if host.get(k) is None]
        if missing:
            raise ProblemError(f"learn names {missing}, which are not given: there is nothing to learn")
        P = _validated({k: host.get(k) for k in PARTS}, self._dependent)  # shapes, NaN, rank of B, lb <= ub
        self.n = P.n
        # the shapes the Polyhedron validated: a scalar right-hand side or bound is broadcast to its rows /
        # coordinates (the functional form takes a, b of shape (m,) only)
        shapes = {"A": P.A_dense.shape, "a": P.a.shape, "B": P.B_dense.shape, "b": P.b.shape, "lb": (P.n,),
                  "ub": (P.n,)}
        for k in PARTS:
            v = host.get(k)
            t = None if v is None else torch.tensor(np.broadcast_to(np.asarray(v, dtype=np.float64), shapes[k]),
                                                    dtype=dtype)  # a copy
            if k in learn:
                self.register_parameter(k, nn.Parameter(t))
            else:
                self.register_buffer(k, t)
        return P

    def _own(self, S: Projector) -> None:
        """The set's tensors, registered in the child module ``set_data``: optimisers, state_dict and .to() see them.

        An ``nn.Parameter`` is registered as itself (a parameter), a copy of a tensor that needs no gradient as a buffer
        (the caller's tensor is never written by the layer: ``load_state_dict`` copies into buffers in place); a tensor
        that requires grad without being a Parameter (a leaf the caller steps, or one computed from others) stays the
        caller's. :meth:`forward` projects onto the set with the registered tensors (moved by ``.to()``, loaded by
        ``load_state_dict``, swapped by ``torch.func.functional_call``). A Polyhedral set's data are fixed (not learned
        through the layer: give its Polyhedron or the tensors): not registered.
        """
        self._set_names: tuple[str, ...] = ()
        if isinstance(S, Polyhedral):
            return
        own = {k: v for k, v in S.parameters().items() if isinstance(v, torch.Tensor)
               and (isinstance(v, nn.Parameter) or not v.requires_grad)}
        if not own:
            return
        self.set_data = nn.Module()
        for k, v in own.items():
            try:
                if isinstance(v, nn.Parameter):
                    self.set_data.register_parameter(k, v)
                else:  # a copy, as the constraint data's buffers are: load_state_dict, .copy_() or .fill_() on
                    # the layer's buffer write into it in place and must not reach the caller's tensor (nor the set)
                    self.set_data.register_buffer(k, v.detach().clone())
            except (KeyError, TypeError) as exc:  # a name torch refuses: with a dot, empty, an nn.Module attribute
                raise ProblemError(f"{type(S).__name__}'s parameter {k!r} cannot be registered on the layer "
                                   f"({exc}): give it another name") from None
        self._set_names = tuple(own)

    def _current_set(self) -> Projector:
        """:attr:`set` with the tensors registered in ``set_data`` as they are now (:meth:`_own`)."""
        names = getattr(self, "_set_names", ())
        if not names:
            return self.set
        return self.set.with_parameters(**{k: getattr(self.set_data, k) for k in names})

    __prepare_scriptable__ = _refuse_script  # torch.jit.script(layer), or of a module holding it: a ProblemError

    def __getstate__(self) -> dict:
        """Pickling drops the warm start's last result (it holds the projection's factored faces)."""
        state = dict(self.__dict__)
        state["_last"] = None
        return state

    def _buffer_state(self) -> tuple:
        """What identifies the buffers' contents: identity, version counter and a copy of each.

        ``load_state_dict``, ``fill_`` and ``.to()`` change the first two; a change through ``.data`` changes
        neither, so the contents are compared with the copies as well (``torch.equal``, as the functional
        form's cache does).
        """
        return tuple((k, None, None, None) if getattr(self, k) is None else
                     (k, id(getattr(self, k)), _version(getattr(self, k)), getattr(self, k).detach().clone())
                     for k in PARTS)

    def _changed(self) -> bool:
        """The buffers differ from what :attr:`set` was recognised from."""
        for k, ident, version, copy in self._seen:
            now = getattr(self, k)
            if (now is None) != (copy is None):
                return True
            if now is not None and ((id(now), _version(now)) != (ident, version) or now.shape != copy.shape
                                    or now.is_meta or not torch.equal(now.detach(), copy)):
                return True
        return False

    def _recognised(self) -> Projector | None:
        """The structured set of the buffers as they are now (recognised again after they changed)."""
        if getattr(self, "_recognising", False) and self._changed():  # (a meta tensor counts as changed)
            # read to the host next: not a meta tensor (a layer built under `with torch.device("meta")`), not
            # bfloat16 (no NumPy type: a TypeError from .numpy())
            parts = {k: getattr(self, k, None) for k in PARTS}
            _refuse_meta({f"the layer's {k}": v for k, v in parts.items()})
            for k, v in parts.items():
                if v is not None and v.dtype not in (torch.float32, torch.float64):
                    raise ProblemError(f"the layer's {k} has dtype {v.dtype}: a layer's constraint data are float32 "
                                       "or float64 (.float() or .double())")
            host = {k: None if v is None else v.detach().cpu().numpy() for k, v in parts.items()}
            self.set = recognise(_validated(host, self._dependent))
            self._seen, self._last = self._buffer_state(), None
        return self.set

    @_eager_under_compile
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Project ``x`` (..., n); with ``warm_start`` the previous call's active sets start the polish."""
        x = _check_x(x)
        parts = {k: getattr(self, k, None) for k in PARTS}  # (a layer of a structured set holds none)
        # data that a gradient is taken of (a buffer made to require grad, a parameter swapped in by
        # torch.func.functional_call) go the general way: the recognised set holds host copies, which cut their
        # gradients (b.grad None, silently) or cannot be read at all under torch.func; so do data with batch
        # dimensions (per-sample data swapped in by functional_call), which are no Polyhedron to recognise a set in
        # (refused as one when they needed no gradient, accepted when they did)
        general = any(isinstance(t, torch.Tensor) and (t.requires_grad or _ft.is_functorch_wrapped_tensor(t)
                                                       or t.ndim > (2 if k in ("A", "B") else 1))
                      for k, t in parts.items())
        if not general:
            self._recognised()
        warm = self._last if self.warm_start and getattr(self, "_last_general", general) == general else None
        self._last_general = general
        if self.set is not None and not general:
            for k, v in parts.items():  # the general path's rule (one dtype and device for x and the data)
                if isinstance(v, torch.Tensor):
                    _as_like(v, k, x)
            y, res = _project(x, self._current_set(), dict.fromkeys(PARTS), "auto", {}, warm)
        else:
            if isinstance(x, torch.Tensor) and x.ndim >= 1 and x.shape[-1] != self.n:  # x is what is wrong here
                raise ProblemError(f"x must have shape (..., {self.n}) to match the layer's constraints "
                                   f"(n = {self.n}), got {tuple(x.shape)}")
            y, res = _project(x, None, parts, self.backend, self.settings, warm)
        # an empty batch is no guess for the next one; nor is a vmap's folded result (the slices of a batch
        # folded into one, _Folded, or sliced, _Sliced): a later call outside the vmap does not project that batch
        if self.warm_start and not isinstance(res, (_Folded, _Sliced)) and res.y.shape[0]:
            self._last = res
        return y

    def extra_repr(self) -> str:
        """Sizes of the constraint data and the backend."""
        if self.set is not None and not hasattr(self, "B"):
            # with the registered tensors the forward projects with (_own); a meta tensor has no value to show
            owned = [*self.set_data.parameters(), *self.set_data.buffers()] if getattr(self, "_set_names", ()) else []
            if any(t.is_meta for t in owned):
                return f"{type(self.set).__name__}(n={self.n}, {', '.join(self._set_names)} on the 'meta' device)"
            return repr(self._current_set())

        def rows(t):
            return 0 if t is None else int(t.shape[-2])

        def fin(t):  # a meta tensor has a shape but no values to count: its shape
            return 0 if t is None else f"meta{tuple(t.shape)}" if t.is_meta else int(torch.isfinite(t).sum())

        learned = [k for k, _ in self.named_parameters(recurse=False)]
        s = (f"n={self.n}, inequalities={rows(self.A)}, equalities={rows(self.B)}, lower bounds={fin(self.lb)}, "
             f"upper bounds={fin(self.ub)}, backend={self.backend!r}")
        s += f", learned={learned}" if learned else ""
        return s + (f", structured={self.set.inner!r}" if self.set is not None else "")
