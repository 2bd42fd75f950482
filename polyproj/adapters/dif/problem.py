"""Constrained ERM problem specification for the DIF engine (docs/dif.md).

The problem is::

    minimise   f₀(θ) = mean_i ℓ₀(z_i, θ)
    subject to gⱼ(θ) = mean_i ℓⱼ(z_i, θ) − τⱼ <= 0      (or = 0 for ``kind="eq"``)

``fn(params_or_model, batch)`` returns the per-sample losses of a batch; a data-free constraint
(``data=None``) has ``fn(params)`` (or ``fn(params, None)``) return a single value. Everything is
evaluated in float64 on a flat parameter vector θ, so that ``torch.func`` can differentiate it.
"""

from __future__ import annotations

import copy
import inspect
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from ...errors import ProblemError, close_matches
from ...linalg import own_contiguous

__all__ = ["ConstrainedProblem", "Constraint", "Loss", "Removal"]

#: ``{loss name: indices removed from that loss's data}``
Removal = Mapping[str, Any]


def _as_float64(t: Any) -> Any:
    """A copy of a data tensor on the CPU (float64 for floating data).

    The problem's data cannot change under its derivatives (the engine caches H and the constraint
    Jacobian) when the caller edits their tensors in place. The engine computes on the CPU (its Krylov
    solves, QPs and scores are SciPy's and the backends'): data on another device are copied here.
    """
    if isinstance(t, torch.Tensor):
        t = t.detach()
        if t.is_floating_point():
            return t.to("cpu", torch.float64, copy=True)
        return t.to("cpu", copy=True)
    return t


def _prepare_data(data: Any, name: str) -> tuple[Any, int | None]:
    """Validate a tensor or tuple of tensors sharing the sample dimension; return (data, N)."""
    if data is None:
        return None, None
    items = data if isinstance(data, tuple) else (data,)
    if len(items) == 0:
        raise ProblemError(f"{name}: data is an empty tuple")
    conv = []
    for k, t in enumerate(items):
        if isinstance(t, np.ndarray):  # torch takes neither negative strides nor (without a warning) read-only memory
            t = torch.from_numpy(own_contiguous(t))
        if not isinstance(t, torch.Tensor):
            raise ProblemError(f"{name}: data[{k}] must be a tensor, got {type(t).__name__}")
        if t.ndim == 0:
            raise ProblemError(f"{name}: data[{k}] is a scalar; the first dimension must index samples")
        if t.is_meta:
            raise ProblemError(f"{name}: data[{k}] is on the 'meta' device: it has a shape but no values")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ProblemError(f"{name}: data[{k}] contains NaN or inf")
        conv.append(_as_float64(t))
    sizes = {int(t.shape[0]) for t in conv}
    if len(sizes) != 1:
        raise ProblemError(f"{name}: the data tensors must share the first (sample) dimension, "
                           f"got sizes {sorted(sizes)}")
    n = sizes.pop()
    if n == 0:
        raise ProblemError(f"{name}: data has no samples")
    return (tuple(conv) if isinstance(data, tuple) else conv[0]), n


def sample_indices(idx: Any, n: int, what: str) -> np.ndarray:
    """``idx`` as distinct int64 indices into ``n`` samples, in the given order (``what`` names it in errors).

    Accepted: integers (a list, an array, a tensor; integral floats such as ``3.0`` too) in [0, n), or a
    boolean mask of shape (n,), which selects the samples where it is True. The range is checked on the values
    given, before any cast: a float such as ``1e20`` or ``inf`` has no int64 value (NumPy's cast gives
    −2⁶³ with a RuntimeWarning).
    """
    if isinstance(idx, torch.Tensor):
        idx = idx.detach().cpu().numpy()
    try:
        arr = np.atleast_1d(np.asarray(idx))
    except ValueError as exc:  # a ragged nested list: NumPy's ValueError named neither the loss nor the fix
        raise ProblemError(f"{what}: indices must be a 1-D list of integers ({exc})") from exc
    if arr.dtype == bool:
        if arr.shape != (n,):
            raise ProblemError(f"{what}: a boolean mask must have shape ({n},), got {arr.shape}")
        arr = np.flatnonzero(arr)
    if arr.dtype == object:  # Python integers beyond int64 (10**20) arrive as objects: judged as floats
        odd = [type(v).__name__ for v in arr.flat if not isinstance(v, (int, float, np.number))]
        if odd:
            raise ProblemError(f"{what}: indices must be integers, got {odd[0]}")
        arr = arr.astype(np.float64)
    if arr.size and arr.dtype.kind not in "iu":
        if arr.dtype.kind != "f":
            raise ProblemError(f"{what}: indices must be integers, got dtype {arr.dtype}")
        if not np.all(np.isfinite(arr)):
            raise ProblemError(f"{what}: indices must be finite integers, got {arr[~np.isfinite(arr)][0]}")
        if not np.all(arr == np.round(arr)):
            raise ProblemError(f"{what}: indices must be integers, got {arr[arr != np.round(arr)][0]}")
    if arr.ndim > 1:
        raise ProblemError(f"{what}: indices must be a 1-D list, got shape {arr.shape}")
    arr = arr.reshape(-1)
    bad = (arr < 0) | (arr >= n)
    if np.any(bad):
        v = arr[bad][0]
        shown = f"{v:g}" if arr.dtype.kind == "f" and abs(v) >= 1e15 else str(int(v))
        raise ProblemError(f"{what}: index {shown} is out of range for {n} samples "
                           "(indices must lie in [0, N); negative indices are not accepted)")
    arr = arr.astype(np.int64)
    if np.unique(arr).size != arr.size:
        raise ProblemError(f"{what}: repeated indices")
    return arr


def placement_error(exc: RuntimeError, what: str) -> ProblemError | None:
    """A ProblemError for torch's dtype or device mismatch inside a user's function (else None)."""
    msg = str(exc)
    if not any(k in msg for k in ("dtype", "device", "Double", "Float", "Half")):
        return None
    return ProblemError(f"{what} ({msg.splitlines()[0] if msg else type(exc).__name__}): the problem computes in "
                        "float64 on the CPU (its θ, data and module), so a tensor a function holds itself must be "
                        "float64 and on the CPU (e.g. w.double().cpu())")


def _check_finite(v: torch.Tensor, what: str) -> None:
    if v.is_floating_point() and not bool(torch.isfinite(v).all()):
        bad = int(torch.nonzero(~torch.isfinite(v))[0, 0])
        raise ProblemError(f"{what}: fn returns NaN or inf at the initial parameters (sample {bad})")


def _take(data: Any, idx: torch.Tensor) -> Any:
    if isinstance(data, tuple):
        return tuple(t[idx] for t in data)
    return data[idx]


def _prepare_weights(w: Any, name: str, n: int | None, renormalize: bool) -> torch.Tensor:
    """Per-sample weights: a finite 1-D float64 tensor of one weight per sample (a copy)."""
    if n is None:
        raise ProblemError(f"{name}: weights are per sample, and this term has no data")
    try:
        t = torch.as_tensor(w.detach() if isinstance(w, torch.Tensor)
                            else own_contiguous(np.asarray(w, dtype=np.float64)))
    except (TypeError, ValueError) as exc:
        raise ProblemError(f"{name}: weights must be a 1-D array of numbers, got {type(w).__name__}: {exc}") from None
    t = t.to("cpu", torch.float64, copy=True)
    if t.shape != (n,):
        raise ProblemError(f"{name}: weights must have one entry per sample, shape ({n},), got {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()):
        raise ProblemError(f"{name}: weights contain NaN or inf")
    if renormalize and float(t.sum()) == 0.0:
        raise ProblemError(f"{name}: the weights sum to 0, so their weighted mean is undefined")
    return t


class _Term:
    """Shared validation of :class:`Loss` and :class:`Constraint`."""

    def _validate(self) -> None:
        if not callable(self.fn):
            raise ProblemError(f"{self.name}: fn must be callable, got {type(self.fn).__name__}")
        if not isinstance(self.name, str) or not self.name:
            raise ProblemError(f"loss name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.renormalize, (bool, np.bool_)):
            raise ProblemError(f"{self.name}: renormalize must be True or False, got {self.renormalize!r}")
        data, n = _prepare_data(self.data, self.name)
        object.__setattr__(self, "data", data)
        if self.weights is not None:
            object.__setattr__(self, "weights", _prepare_weights(self.weights, self.name, n, self.renormalize))

    @property
    def n_samples(self) -> int | None:
        """Number of samples (None for a data-free term)."""
        if self.data is None:
            return None
        return int((self.data[0] if isinstance(self.data, tuple) else self.data).shape[0])


@dataclass(frozen=True, eq=False)
class Loss(_Term):
    """The objective: ``fn(params_or_model, batch)`` returns one loss per sample of ``batch``.

    Parameters
    ----------
    fn : callable
    data : tensor or tuple of tensors sharing the first (sample) dimension
    name : str
        Always ``"objective"`` inside a :class:`ConstrainedProblem`.
    """

    fn: Callable[..., Any]
    data: Any = None
    name: str = "objective"
    weights: torch.Tensor | None = field(default=None, repr=False, kw_only=True)
    renormalize: bool = field(default=True, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        self._validate()


@dataclass(frozen=True, eq=False)
class Constraint(_Term):
    """Constraint ``mean(fn(params, data)) − tau <= 0`` (``kind="eq"``: ``= 0``).

    Parameters
    ----------
    fn : callable
        ``fn(params_or_model, batch)`` -> per-sample values; with ``data=None``, ``fn(params)``
        (or ``fn(params, None)``) -> one value, e.g. a linear constraint on θ.
    data : tensor, tuple of tensors, or None
    tau : float
    name : str
        Unique among the constraints; not ``"objective"``.
    kind : {"ineq", "eq"}
    """

    fn: Callable[..., Any]
    data: Any = None
    tau: float = 0.0
    name: str = "constraint"
    kind: str = "ineq"
    weights: torch.Tensor | None = field(default=None, repr=False, kw_only=True)
    renormalize: bool = field(default=True, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        self._validate()
        if self.kind not in ("ineq", "eq"):
            raise ProblemError(f"constraint {self.name!r}: kind must be 'ineq' or 'eq', got {self.kind!r}")
        try:
            tau = float(self.tau)
        except (TypeError, ValueError):
            raise ProblemError(f"constraint {self.name!r}: tau must be a number, got {self.tau!r}") from None
        if not np.isfinite(tau):
            raise ProblemError(f"constraint {self.name!r}: tau must be finite, got {self.tau}")
        object.__setattr__(self, "tau", tau)


def _as_constraints(constraints: Any) -> tuple[Constraint, ...]:
    """The ``constraints`` argument as a tuple: a single Constraint is one, None none."""
    if constraints is None:
        return ()
    if isinstance(constraints, Constraint):
        return (constraints,)
    if isinstance(constraints, (str, bytes, Mapping)) or not isinstance(constraints, Iterable):
        raise ProblemError("constraints must be a Constraint, a list of Constraint objects or None, got "
                           f"{type(constraints).__name__}")
    out = tuple(constraints)
    for c in out:
        if not isinstance(c, Constraint):
            raise ProblemError(f"constraints must be Constraint objects, got {type(c).__name__} in the list")
    return out


def _as_float64_input(a: Any) -> Any:
    if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != torch.float64:
        return a.to(torch.float64)
    return a


# ``torch.func.functional_call`` swaps the module's parameters in place for the duration of the call
# and swaps them back on exit: two threads calling one module at once would each restore the other's
# tensors, scoring with the wrong θ and leaving the module holding transformed (non-leaf) tensors. The
# swaps of all modules are serialised by one lock (re-entrant: a model may call a wrapped submodule);
# backward passes run after the call returns and stay parallel.
_SWAP_LOCK = threading.RLock()


#: nn.Module methods that convert or modify a module in place: refused on the problem's copy
_MUTATORS = frozenset({"float", "double", "half", "bfloat16", "to", "cuda", "cpu", "type", "apply", "requires_grad_",
                       "load_state_dict", "register_buffer", "register_parameter", "add_module", "zero_grad",
                       "share_memory", "to_empty", "set_extra_state", "register_module"})


class _FunctionalModule:
    """Calls ``model`` with the parameters taken from a flat vector (``torch.func.functional_call``).

    Thread-safe: calls on one module from several threads (a thread-pool executor) are serialised.
    """

    def __init__(self, model: nn.Module, params: dict[str, torch.Tensor]) -> None:
        self._model, self._params = model, params

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # the module runs in float64 (θ's dtype): floating inputs of another dtype (a user's float32 test
        # data) are cast, as the problem's own data were
        args = tuple(_as_float64_input(a) for a in args)
        kwargs = {k: _as_float64_input(v) for k, v in kwargs.items()}
        with _SWAP_LOCK:
            return torch.func.functional_call(self._model, self._params, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        # parameters and submodules resolve to θ's tensors (``m.bias``, ``m.layer1.weight``)
        params = self.__dict__["_params"]
        if name in params:
            return params[name]
        sub = {k[len(name) + 1:]: v for k, v in params.items() if k.startswith(name + ".")}
        if sub:
            return _FunctionalModule(getattr(self._model, name), sub)
        if name in ("train", "eval"):  # the problem's copy stays as built (checked deterministic): a test function's
            return lambda *a, **k: self  # ``m.eval(); ...; m.train()`` would switch dropout on for later calls
        if name in _MUTATORS:
            raise ProblemError(f"the module given to losses, constraints and test functions must not be changed: "
                               f"m.{name}(...) would convert or modify the problem's own copy of it (inputs are cast "
                               "to float64 for you; compute in another dtype on a copy of your own)")
        return getattr(self._model, name)

    # the module's own accessors would hand out its frozen copy of the parameters, not θ's tensors: a
    # weight decay or norm constraint written with them would not depend on θ
    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True) -> Any:
        """The module's ``named_parameters`` with θ's tensors for the trainable ones.

        Their ``requires_grad`` is True as in the user's module (frozen ones: False), also where the engine
        evaluates values without gradients (``torch.no_grad``): a weight decay written
        ``sum(p.pow(2).sum() for p in m.parameters() if p.requires_grad)`` must count in the objective's
        value as in its gradient (it was left out of the values, and ``solve`` stalled). A plain θ is
        evaluated without gradients for the same reason (:meth:`ConstrainedProblem.per_sample`). Under
        ``torch.func.vmap`` alone (no gradient transform) the flags cannot be set: there such a filter sees
        False; filter by name (``named_parameters``) instead.
        """
        for k, p in self._model.named_parameters(recurse=recurse, remove_duplicate=remove_duplicate):
            t = self._params.get(k)
            if t is None:
                t = p  # frozen: the module's own tensor
            elif not t.requires_grad and not torch.is_grad_enabled():
                t = t.detach().requires_grad_(True)  # the same values; no graph is recorded here
            yield (prefix + ("." if prefix else "") + k), t

    def parameters(self, recurse: bool = True) -> Any:
        """The module's ``parameters`` with θ's tensors for the trainable ones."""
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def get_submodule(self, target: str) -> Any:
        """The submodule ``target`` ("a.b.c"), its parameters θ's tensors."""
        out: Any = self
        for part in target.split(".") if target else ():
            out = getattr(out, part)
        return out

    def named_children(self) -> Any:
        for k, _ in self._model.named_children():
            yield k, getattr(self, k)

    def children(self) -> Any:
        for _, c in self.named_children():
            yield c

    def named_modules(self, memo: Any = None, prefix: str = "", remove_duplicate: bool = True) -> Any:
        yield prefix, self
        for k, c in self.named_children():
            yield from c.named_modules(prefix=prefix + ("." if prefix else "") + k) if isinstance(
                c, _FunctionalModule) else ((prefix + ("." if prefix else "") + k, c),)

    def modules(self) -> Any:
        for _, mod in self.named_modules():
            yield mod

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The module's ``state_dict`` with θ's tensors for the trainable parameters."""
        out = self._model.state_dict(*args, **kwargs)
        return type(out)((k, self._params.get(k, v)) for k, v in out.items())

    def __getitem__(self, idx: Any) -> Any:
        """``m[i]`` of a Sequential / ModuleList / ModuleDict, its parameters θ's tensors."""
        keys = list(self._model._modules.keys())
        if isinstance(idx, (int, np.integer)):
            try:
                name = keys[int(idx)]
            except IndexError:
                raise IndexError(f"index {idx} is out of range for {len(keys)} submodules") from None
        elif isinstance(idx, str) and idx in keys:
            name = idx
        else:
            raise ProblemError(f"the module wrapper takes an integer or a submodule name as index, got {idx!r}")
        return getattr(self, name)

    def __len__(self) -> int:
        return len(self._model)

    def __iter__(self) -> Any:
        return iter(self.children())


def _takes_batch(fn: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins (torch.linalg.vector_norm, a partial of torch.dot): fn(θ), the
        return False  # documented form (read as fn(θ, None) they raised a TypeError on their second argument)
    # required positional parameters only: ``lambda th, j=j: th[j]`` (a loop variable captured as a default) is
    # a function of θ alone
    pos = [p for p in sig.parameters.values()
           if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    var = any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values())
    return var or len(pos) >= 2


#: layers whose training-mode forward is random or depends on the batch (not a function of θ and a sample)
_TRAIN_MODE_LAYERS = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm,
                      nn.modules.instancenorm._InstanceNorm)


def _check_deterministic(model: nn.Module) -> None:
    """A ``ProblemError`` for a module in training mode with layers whose training forward is not a function of θ."""
    found = [k or type(mod).__name__ for k, mod in model.named_modules()
             if mod.training and isinstance(mod, _TRAIN_MODE_LAYERS)
             and not (isinstance(mod, nn.modules.instancenorm._InstanceNorm) and not mod.track_running_stats)]
    if found:
        more = ", ..." if len(found) > 4 else ""
        raise ProblemError(f"the module is in training mode with dropout or batch-normalisation layers "
                           f"({', '.join(found[:4])}{more}): its losses are random or depend on the batch, not a "
                           "function of θ and each sample; pass model.eval() (DIF differentiates a deterministic "
                           "full-batch objective)")



def computed_from(out: Any, t: torch.Tensor) -> bool:
    """Whether ``out`` is computed from ``t``: ``t`` is in its autograd graph (structural, not a non-zero gradient).

    ``out.requires_grad`` alone is not enough: the user's own module, called instead of the one a function is given,
    has parameters that require grad. A value of ``t`` with a zero gradient there (``‖t‖²`` at 0) is computed from it.
    """
    return (isinstance(out, torch.Tensor) and out.requires_grad
            and torch.autograd.grad(out.sum(), t, allow_unused=True, retain_graph=True)[0] is not None)

class ConstrainedProblem:
    """``min mean ℓ₀ s.t. mean ℓⱼ − τⱼ <= 0`` over a flat float64 parameter vector θ.

    Parameters
    ----------
    params : 1-D tensor or nn.Module
        The point the problem is set up at (copied to float64; the user's object is not touched).
    objective : Loss
    constraints : Constraint, sequence of Constraint, or None
        A single Constraint counts as a one-element list; None or ``()`` (the default): no constraints.

    Examples
    --------
    >>> import torch
    >>> from polyproj.adapters.dif import ConstrainedProblem, Loss, Constraint
    >>> X, y = torch.randn(20, 3, dtype=torch.float64), torch.randn(20, dtype=torch.float64)
    >>> prob = ConstrainedProblem(torch.zeros(3), objective=Loss(lambda th, b: (b[0] @ th - b[1]) ** 2, (X, y)),
    ...                           constraints=[Constraint(lambda th: th.sum(), None, tau=1.0, name="sum")])
    >>> prob.dim, prob.names
    (3, ('objective', 'sum'))
    """

    def __init__(self, params: torch.Tensor | nn.Module, objective: Loss,
                 constraints: Constraint | Sequence[Constraint] | None = ()) -> None:
        meta = [k for k, p in (params.named_parameters() if isinstance(params, nn.Module) else [("params", params)])
                if isinstance(p, torch.Tensor) and p.is_meta]
        if meta:
            raise ProblemError(f"params: {meta[0]} is on the 'meta' device: it has a shape but no values "
                               "(materialise the module, e.g. with to_empty() and its initialisation, first)")
        if isinstance(params, nn.Module):
            _check_deterministic(params)
            self.model: nn.Module | None = copy.deepcopy(params).double().cpu()
            named = [(k, p) for k, p in self.model.named_parameters() if p.requires_grad]
            if not named:
                raise ProblemError("params: the module has no trainable parameters")
            self._names = [k for k, _ in named]
            self._shapes = [tuple(p.shape) for _, p in named]
            # tied parameters (one tensor under several names: ``b.weight = a.weight``) are one entry of θ;
            # every other name of it must resolve to θ's tensor too (``m.b(x)``, ``state_dict()``), not to the
            # module's frozen copy
            first = {id(p): k for k, p in named}
            self._aliases = {k: first[id(p)] for k, p in self.model.named_parameters(remove_duplicate=False)
                             if id(p) in first and first[id(p)] != k}
            theta = torch.cat([p.detach().reshape(-1) for _, p in named])
        elif isinstance(params, torch.Tensor) or isinstance(params, np.ndarray):
            theta = torch.as_tensor(own_contiguous(params) if isinstance(params, np.ndarray) else params).detach()
            if theta.ndim != 1:
                raise ProblemError(f"params must be a 1-D tensor or an nn.Module, got shape {tuple(theta.shape)}")
            if not theta.is_floating_point():
                raise ProblemError(f"params must be a floating tensor, got {theta.dtype}")
            self.model = None
        else:
            raise ProblemError(f"params must be a 1-D tensor or an nn.Module, got {type(params).__name__}")
        theta = theta.to("cpu", torch.float64, copy=True)
        if theta.numel() == 0 or not bool(torch.isfinite(theta).all()):
            raise ProblemError("params must be non-empty and finite")
        self.theta0 = theta
        if not isinstance(objective, Loss):
            raise ProblemError(f"objective must be a Loss, got {type(objective).__name__}")
        if objective.data is None:
            raise ProblemError("objective: data is required (the objective is a mean over training samples)")
        if objective.name != "objective":
            objective = replace(objective, name="objective")
        constraints = _as_constraints(constraints)
        names = [c.name for c in constraints]
        if "objective" in names:
            raise ProblemError("a constraint cannot be named 'objective'")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ProblemError(f"constraint names must be unique; repeated: {dup}")
        self.objective = objective
        self.constraints = constraints
        self._free_call = {c.name: _takes_batch(c.fn) for c in constraints if c.data is None}
        # evaluate once: shapes and finiteness
        with torch.no_grad():
            per = self._first_values(objective, theta, "objective")
            if per.ndim != 1 or per.shape[0] != objective.n_samples:
                raise ProblemError(f"objective: fn must return one loss per sample, shape ({objective.n_samples},), "
                                   f"got {tuple(per.shape)}")
            _check_finite(per, "objective")
            for c in constraints:
                v = self._first_values(c, theta, f"constraint {c.name!r}")
                want = 1 if c.data is None else c.n_samples
                if v.ndim != 1 or v.shape[0] != want:
                    raise ProblemError(f"constraint {c.name!r}: fn must return "
                                       + ("one value" if c.data is None else f"one loss per sample ({want})")
                                       + f", got shape {tuple(v.shape)}")
                _check_finite(v, f"constraint {c.name!r}")
        for term in (objective, *constraints):
            self._check_depends(term, theta)

    def _first_values(self, loss: Loss, theta: torch.Tensor, what: str) -> torch.Tensor:
        """``per_sample`` at θ0; torch's dtype or device mismatch becomes a ProblemError that says why."""
        try:
            return self.per_sample(loss, theta)
        except RuntimeError as exc:
            err = placement_error(exc, f"{what}: fn failed at the initial parameters")
            if err is None:
                raise
            raise err from exc

    def _check_depends(self, loss: Loss, theta: torch.Tensor) -> None:
        """A ``ProblemError`` for a term whose value is not computed from θ (on a few of its samples).

        A detached copy, a Python float, the model outside the function: the engine would see a constant
        (a constraint dropped, or called infeasible). The test is structural: θ must be in the value's autograd
        graph. ``out.requires_grad`` alone is not enough (the user's own module, called instead of the one the
        function is given, has parameters that require grad); a term that depends on θ with a zero gradient at
        θ0 (e.g. ‖θ‖² at 0) passes. Complex values are refused first: a loss is real (torch's autograd raised a
        bare RuntimeError on them here).
        """
        t = theta.detach().clone().requires_grad_(True)
        data = loss.data if loss.data is None else _take(loss.data, torch.arange(min(4, loss.n_samples)))
        what = "objective" if loss.name == "objective" else f"constraint {loss.name!r}"
        with torch.enable_grad():
            out = self.per_sample(loss, t, data if loss.data is not None else "all")
            if out.is_complex():
                raise ProblemError(f"{what}: fn returns complex values ({out.dtype}); the losses and constraints "
                                   "must be real (take .real, .abs() or .abs() ** 2 of a complex quantity)")
            uses = computed_from(out, t)
        if not uses:
            raise ProblemError(f"{what}: fn's value does not depend on its parameter argument (it is not computed "
                               "from it: a detached copy, a NumPy or Python number, or the model used outside the "
                               "function?)")

    # ------------------------------------------------------------------ structure
    @property
    def dim(self) -> int:
        """Number of parameters d."""
        return int(self.theta0.numel())

    @property
    def m(self) -> int:
        """Number of constraints."""
        return len(self.constraints)

    @property
    def names(self) -> tuple[str, ...]:
        """``("objective", constraint names...)``."""
        return ("objective", *(c.name for c in self.constraints))

    @property
    def taus(self) -> np.ndarray:
        """Constraint levels τ."""
        return np.array([c.tau for c in self.constraints], dtype=np.float64)

    @property
    def eq_mask(self) -> np.ndarray:
        """Equality constraints."""
        return np.array([c.kind == "eq" for c in self.constraints], dtype=bool)

    def loss(self, name: str) -> Loss | Constraint:
        """The loss (objective or constraint) called ``name``."""
        if name == "objective":
            return self.objective
        for c in self.constraints:
            if c.name == name:
                return c
        raise ProblemError(f"unknown loss name {name!r}; the losses are {list(self.names)}."
                           + close_matches(str(name), list(self.names)))

    # ------------------------------------------------------------------ evaluation
    def wrap(self, theta: torch.Tensor) -> Any:
        """What the user's functions receive: θ itself, or the module with θ's parameters."""
        if not isinstance(theta, torch.Tensor):
            raise ProblemError(f"wrap takes the flat parameter vector θ (a 1-D tensor), got {type(theta).__name__}; "
                               "the losses, constraints and test functions of a module problem already receive the "
                               "module")
        if self.model is None:
            return theta
        chunks = torch.split(theta, [int(np.prod(s)) for s in self._shapes])
        params = {k: c.reshape(s) for k, c, s in zip(self._names, chunks, self._shapes, strict=True)}
        for alias, name in getattr(self, "_aliases", {}).items():
            params[alias] = params[name]
        return _FunctionalModule(self.model, params)

    def per_sample(self, loss: Loss, theta: torch.Tensor, data: Any = "all") -> torch.Tensor:
        """Per-sample losses of ``loss`` at θ (1-D; one value for a data-free constraint)."""
        if (torch.is_grad_enabled() and isinstance(theta, torch.Tensor) and not theta.requires_grad
                and not torch._C._functorch.is_functorch_wrapped_tensor(theta)):
            # a plain θ carries no gradient: evaluated without one, where the module's parameters report
            # requires_grad as the user's module does (in grad mode they said False, and a weight decay written
            # ``... for p in m.parameters() if p.requires_grad`` was left out of the values)
            with torch.no_grad():
                return self.per_sample(loss, theta, data)
        p = self.wrap(theta)
        if loss.data is None:
            out = loss.fn(p, None) if self._free_call.get(loss.name, False) else loss.fn(p)
        else:
            out = loss.fn(p, loss.data if isinstance(data, str) else data)
        out = torch.as_tensor(out)
        return out.reshape(-1) if out.ndim == 0 else out

    def mean(self, loss: Loss, theta: torch.Tensor) -> torch.Tensor:
        """The (weighted) mean of ``loss`` at θ, the quantity the problem constrains/minimises."""
        v = self.per_sample(loss, theta)
        if loss.data is None:
            return v.sum()
        if loss.weights is None:
            return v.mean()
        w = loss.weights.to(v.dtype)
        denom = w.sum() if loss.renormalize else torch.tensor(float(w.numel()), dtype=v.dtype)
        return (w * v).sum() / denom

    def objective_value(self, theta: torch.Tensor) -> torch.Tensor:
        """f₀(θ)."""
        return self.mean(self.objective, theta)

    def constraint_values(self, theta: torch.Tensor) -> torch.Tensor:
        """g(θ) = mean ℓⱼ − τⱼ, shape (m,)."""
        if not self.constraints:
            return theta.new_zeros(0)
        return torch.stack([self.mean(c, theta) - c.tau for c in self.constraints])

    def lagrangian(self, theta: torch.Tensor, lambdas: torch.Tensor) -> torch.Tensor:
        """L(θ, λ) = f₀(θ) + Σ λⱼ gⱼ(θ)."""
        out = self.objective_value(theta)
        if self.constraints:
            out = out + (lambdas.to(theta.dtype) * self.constraint_values(theta)).sum()
        return out

    # ------------------------------------------------------------------ removals
    def check_removal(self, removal: Removal) -> dict[str, np.ndarray]:
        """Validate ``removal`` and return it as ``{name: sorted unique int64 indices}``."""
        if not isinstance(removal, Mapping):
            raise ProblemError("removal must map loss names ('objective' or a constraint's name) to indices, "
                               f"got {type(removal).__name__}")
        out: dict[str, np.ndarray] = {}
        for name, idx in removal.items():
            loss = self.loss(name)
            if loss.data is None:
                raise ProblemError(f"removal names {name!r}, which has no data to remove from")
            arr = sample_indices(idx, loss.n_samples, f"removal[{name!r}]")
            n = loss.n_samples
            if arr.size >= n:
                raise ProblemError(f"removal[{name!r}] removes all {n} samples")
            if loss.weights is not None and loss.renormalize and arr.size and \
                    not bool(np.delete(loss.weights.numpy(), arr).any()):  # the kept weights, not a difference
                raise ProblemError(f"removal[{name!r}] removes every sample of nonzero weight: the weighted mean "
                                   "of what remains (weights summing to 0) is undefined")
            if arr.size:
                out[name] = np.sort(arr)
        return out

    def check_single_removals(self) -> None:
        """Validate every removal of one objective sample (``influence(None)``) without forming N of them.

        Such a removal is invalid only when it removes all the samples (N = 1) or, in a loss renormalised by
        its weights, the one sample of nonzero weight: that removal is checked, with :meth:`check_removal`'s
        error.
        """
        obj = self.objective
        first = [0] if obj.n_samples == 1 else []
        if obj.weights is not None and obj.renormalize:
            nonzero = np.flatnonzero(obj.weights.numpy())
            if nonzero.size == 1:
                first.append(int(nonzero[0]))
        for i in first:
            self.check_removal({"objective": [i]})

    def _with_losses(self, mapping: dict[str, Loss]) -> ConstrainedProblem:
        new = copy.copy(self)
        new.objective = mapping.get("objective", self.objective)
        new.constraints = tuple(mapping.get(c.name, c) for c in self.constraints)
        return new

    def remove(self, removal: Removal) -> ConstrainedProblem:
        """The problem retrained without the removed samples (every loss a mean over what remains)."""
        rem = self.check_removal(removal)
        mapping = {}
        for name, idx in rem.items():
            loss = self.loss(name)
            keep = np.setdiff1d(np.arange(loss.n_samples), idx)
            kt = torch.as_tensor(keep)
            w = None if loss.weights is None else loss.weights[kt]
            mapping[name] = replace(loss, data=_take(loss.data, kt), weights=w)
        return self._with_losses(mapping)

    def perturbed(self, removal: Removal, t: float, *, renormalize: bool = True) -> ConstrainedProblem:
        """The PCL problem at ``ε = t·Δε``: removed samples get weight ``1 − t``.

        ``renormalize=True`` keeps every loss a mean over what remains, with its own normaliser (``Σwℓ / Σw``;
        for a loss with ``renormalize=False``, ``Σwℓ / (N − t|Z|)``): ``t = 0`` is this problem, ``t = 1``
        :meth:`remove`. ``False`` is the paper's plain form, every loss over its normaliser at ``t = 0``
        (``Σwℓ / N``, or ``Σwℓ / Σw̄`` with the original weights w̄ for a loss normalised by them: a τ-shifted
        problem, ``t = 0`` still this one, as ``DIF(renormalize=False)`` differentiates it).
        """
        try:
            tf = float(t) if not isinstance(t, (bool, str)) and np.ndim(t) == 0 else None
        except (TypeError, ValueError):
            tf = None
        if tf is None or not tf <= 1.0:  # t < 0 upweights the samples; t > 1 gives them negative weights; NaN fails
            raise ProblemError(f"t must be a number <= 1 (the removed samples' weight is 1 − t), got {t!r}")
        t = tf
        rem = self.check_removal(removal)
        mapping = {}
        for name, idx in rem.items():
            loss = self.loss(name)
            w = torch.ones(loss.n_samples, dtype=torch.float64) if loss.weights is None else loss.weights.clone()
            w[torch.as_tensor(idx)] *= 1.0 - float(t)
            if renormalize and not loss.renormalize:
                # the normaliser N (a count) falls to N − t|Z|: the weights scaled by N / (N − t|Z|), over N
                n = loss.n_samples
                mapping[name] = replace(loss, weights=w * (n / (n - float(t) * idx.size)))
            elif not renormalize and loss.renormalize and loss.weights is not None:
                # plain form of a loss normalised by Σw̄: Σwℓ / Σw̄ is Σ(w N / Σw̄)ℓ / N (over N, Σw̄ was lost: at
                # t = 0 a constraint normalised by Σw̄ = 12.8 read Σwℓ / 10 and was violated)
                n = loss.n_samples
                mapping[name] = replace(loss, weights=w * (n / float(loss.weights.sum())), renormalize=False)
            else:
                mapping[name] = replace(loss, weights=w, renormalize=renormalize)
        return self._with_losses(mapping)

    def __repr__(self) -> str:
        kind = "module" if self.model is not None else "tensor"
        cons = ", ".join(f"{c.name}({c.kind}, N={c.n_samples})" for c in self.constraints)
        return f"ConstrainedProblem(d={self.dim} [{kind}], N0={self.objective.n_samples}, constraints=[{cons}])"
