"""The divergence locator: where does a candidate first compute something else than eager?
(`kernelize.diff(...)`, `python3 -m kernelize.locate`, `kernelize diff`; docs/compile.md.)

A candidate is a substitution of the model: `"inductor"` (plain `torch.compile`), `"exact"`
(kernelize's exact compile), any other `torch.compile` backend name, a module of the same
structure (a kernelized copy, a copy with one layer changed), or a function that turns a module
into its candidate (`lambda m: torch.compile(m, mode="reduce-overhead")`).

1. **Module.** Eager runs once with hooks that record every module's first call (inputs and
   output). Then, from the root down: the candidate of a module is run on exactly the inputs
   eager gave that module, and its output compared bit for bit. The first child (in call
   order) that differs is entered; a differing module none of whose children differs is the
   one named: its own code changes the bits.
2. **Op.** Inside that module, on the same inputs: for a compiled candidate, the module is
   traced into ATen ops and every prefix of that graph (up to each op that computes) is
   compiled by the candidate's backend and compared with eager's value of that op; the first
   op whose value differs is named. For a module candidate, both run under a dispatch mode
   that records every op's output, and the first op whose output (or name) differs is named.
3. **Rewrite.** For inductor, the prefix that first differs is compiled again with one of the
   exact backend's switches at a time (`kernelize.exact`): the first switch that makes it
   equal names the rewrite responsible (a pattern replacement, a dropped intermediate
   rounding, approximate division, or inductor's own lowering/decomposition of that op).

Differences are counted as the verifier counts them (docs/spec.md section 3): bitwise, NaN ==
NaN, max abs diff, max ulp distance in the dtype.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from .discover import DTYPE_OF_NAME

# ---- comparing outputs --------------------------------------------------------------------

_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
             torch.float64: torch.int64}


@dataclass
class Delta:
    """How two outputs differ (all zero: identical bits)."""
    mismatched: int = 0
    numel: int = 0
    max_abs_diff: float = 0.0
    max_ulp: float = 0.0
    note: str = ""

    @property
    def identical(self) -> bool:
        return self.mismatched == 0 and not self.note

    def __str__(self) -> str:
        if self.note:
            return self.note
        return (f"{self.mismatched} of {self.numel} elements differ, max abs diff "
                f"{self.max_abs_diff:.3g}, max {self.max_ulp:.0f} ulp")


def _ordered(t: Tensor) -> Tensor:
    """Float bits as integers ordered like the values (+0 == -0), in int64."""
    i = t.contiguous().view(_INT_VIEW[t.dtype]).to(torch.int64)
    bits = torch.finfo(t.dtype).bits
    sign = (i < 0)
    mag = i & ((1 << (bits - 1)) - 1)
    return torch.where(sign, -mag, mag)


def compare(a: Any, b: Any) -> Delta:
    """Compare two outputs (tensors or nested tuples/lists/dicts of them) bit for bit."""
    la, sa = pytree.tree_flatten(a)
    lb, sb = pytree.tree_flatten(b)
    if sa != sb or len(la) != len(lb):
        return Delta(note=f"outputs have another structure ({sa} vs {sb})")
    d = Delta()
    for x, y in zip(la, lb):
        if not isinstance(x, Tensor) or not isinstance(y, Tensor):
            if isinstance(x, Tensor) or isinstance(y, Tensor) or (x != y and not _is_opaque(x)):
                return Delta(note=f"a non-tensor output differs ({type(x).__name__})")
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            return Delta(note=f"an output's shape or dtype differs ({tuple(x.shape)} {x.dtype} vs "
                              f"{tuple(y.shape)} {y.dtype})")
        x, y = x.detach().cpu(), y.detach().cpu()
        d.numel += x.numel()
        if x.dtype in _INT_VIEW:
            both_nan = x.isnan() & y.isnan()
            ne = (x != y) & ~both_nan
            n = int(ne.sum())
            if n:
                d.mismatched += n
                diff = (x.double() - y.double()).abs()[ne]
                finite = diff[diff.isfinite()]
                if finite.numel():
                    d.max_abs_diff = max(d.max_abs_diff, float(finite.max()))
                ulp = (_ordered(x) - _ordered(y)).abs()[ne]
                nanpar = x.isnan()[ne] ^ y.isnan()[ne]
                d.max_ulp = max(d.max_ulp, float("inf") if bool(nanpar.any()) else float(ulp.max()))
        else:
            n = int((x != y).sum())
            if n:
                d.mismatched += n
                d.max_abs_diff = max(d.max_abs_diff, float((x.double() - y.double()).abs().max()))
    return d


def _is_opaque(x: Any) -> bool:
    return not isinstance(x, (int, float, str, bool, type(None)))


# ---- the candidate ------------------------------------------------------------------------

BACKEND_NAMES = ("inductor", "exact")


def _backend_fn(name: str) -> Any:
    if name == "exact":
        from . import exact
        return exact.backend
    return name


def _transform(candidate: Any, model: nn.Module) -> tuple[Callable[[str, nn.Module], Callable], str]:
    """(path, eager module) -> the candidate's callable for it, and a label."""
    if candidate == "exact":
        # exact compile as users get it (`exact_compile`: the whole module), applied
        # to the module for the call and undone after
        from . import exact

        def make_exact(path: str, m: nn.Module) -> Callable:
            def call(*a: Any, **kw: Any) -> Any:
                exact.exact_compile(m)
                try:
                    return m(*a, **kw)
                finally:
                    exact.uncompile(m)
            return call
        return make_exact, "kernelize.exact_compile"
    if isinstance(candidate, str):
        b = _backend_fn(candidate)
        return (lambda path, m: torch.compile(m, backend=b)), f"torch.compile(backend={candidate!r})"
    if isinstance(candidate, nn.Module):
        if candidate is model:
            raise ValueError("the candidate is the model itself: pass a copy (copy.deepcopy(model)) "
                             "and change that")
        return (lambda path, m: candidate.get_submodule(path)), "a module of the same structure"
    if callable(candidate):
        return (lambda path, m: candidate(m)), getattr(candidate, "__name__", "a function")
    raise TypeError("candidate: a backend name (\"inductor\", \"exact\", ...), an nn.Module of the "
                    "model's structure, or a function module -> callable")


# ---- recording eager ----------------------------------------------------------------------

def _clone(tree: Any) -> Any:
    return pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, Tensor) else t, tree)


@dataclass
class _Call:
    path: str
    args: tuple
    kwargs: dict
    output: Any = None


def _record(model: nn.Module, args: tuple, kwargs: dict) -> tuple[dict[str, _Call], list[str], Any]:
    """Run eager once; every module's first call (by path), the paths in call order."""
    calls: dict[str, _Call] = {}
    order: list[str] = []
    handles = []
    for path, m in model.named_modules():
        def pre(mod, a, kw, path=path):
            if path not in calls:
                calls[path] = _Call(path, _clone(a), _clone(kw))
                order.append(path)
        def post(mod, a, kw, out, path=path):
            c = calls.get(path)
            if c is not None and c.output is None:
                c.output = _clone(out)
        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(m.register_forward_hook(post, with_kwargs=True))
    try:
        with torch.no_grad():
            out = model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return calls, order, out


# ---- the answer ---------------------------------------------------------------------------

@dataclass
class Divergence:
    """Where a candidate first departs from eager (`identical`: nowhere, for these inputs)."""
    candidate: str
    identical: bool
    output: Delta
    module: str | None = None          # its path ("" is the model itself)
    module_class: str | None = None
    module_delta: Delta | None = None
    op: str | None = None               # the first op whose value differs
    op_index: int | None = None
    op_delta: Delta | None = None
    eager_ops: list[str] = field(default_factory=list)      # module candidate: eager's ops there
    candidate_ops: list[str] = field(default_factory=list)  # and the candidate's
    rewrite: str | None = None          # what is responsible, where it was found
    checked: list[str] = field(default_factory=list)         # "path: identical|differs"

    def __str__(self) -> str:
        if self.identical:
            return (f"identical: {self.candidate} computes eager's bits on these inputs "
                    f"({self.output.numel} output elements)")
        lines = [f"{self.candidate} differs from eager: {self.output}"]
        if self.module is not None:
            lines.append(f"  first module: {self.module or '<model>'} ({self.module_class}) on "
                         f"eager's inputs: {self.module_delta}")
        if self.op is not None:
            lines.append(f"  first op: {self.op} (op #{self.op_index} of the module): {self.op_delta}")
        elif self.module is not None:
            lines.append("  first op: not found (the module's ops each match; the difference "
                         "comes from how they are combined)")
        if self.candidate_ops:
            lines.append(f"  eager ran: {', '.join(self.eager_ops[:12])}")
            lines.append(f"  the candidate ran: {', '.join(self.candidate_ops[:12])}")
        if self.rewrite:
            lines.append(f"  responsible: {self.rewrite}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return asdict(self)


def diff(model: nn.Module, inputs: Any, candidate: Any = "inductor", *, kwargs: dict | None = None,
         ops: bool = True, max_ops: int = 256) -> Divergence:
    """Name the first module, and inside it the first op, where `candidate` departs from eager
    on `inputs` (a tensor or a tuple of positional arguments; `kwargs` besides). See the module
    doc. `ops=False` stops at the module. The model is not changed."""
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    kwargs = kwargs or {}
    make, label = _transform(candidate, model)
    calls, order, _ = _record(model, args, kwargs)
    modules = dict(model.named_modules())

    def run(path: str) -> Delta:
        c = calls[path]
        if isinstance(candidate, str):
            # a fresh dynamo per module: the decoder layers share one forward, and past the
            # recompile limit dynamo would run the rest eagerly (and call them identical)
            torch._dynamo.reset()
        fn = make(path, modules[path])
        with torch.no_grad():
            out = fn(*_clone(c.args), **_clone(c.kwargs))
        return compare(c.output, out)

    top = run("")
    res = Divergence(label, top.identical, top, checked=[f"<model>: {'identical' if top.identical else 'differs'}"])
    if top.identical:
        return res
    path, delta = "", top
    while True:
        kids = [p for p in order if p and _parent(p) == path]
        for k in kids:
            d = run(k)
            res.checked.append(f"{k}: {'identical' if d.identical else 'differs'}")
            if not d.identical:
                path, delta = k, d
                break
        else:
            break
    res.module, res.module_class, res.module_delta = path, type(modules[path]).__name__, delta
    if not ops:
        return res
    c = calls[path]
    if isinstance(candidate, str):
        _op_by_prefix(res, modules[path], c, candidate, max_ops)
    else:
        _op_by_dispatch(res, modules[path], make(path, modules[path]), c)
    return res


def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


# ---- the op: module candidates (both run eagerly) ------------------------------------------

class _OpLog(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, Any]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((str(func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else func),
                         _clone(out)))
        return out


def _qualified(op: Any) -> str:
    packet = getattr(op, "overloadpacket", None)
    ns = getattr(op, "namespace", "aten")
    return f"{ns}.{packet.__name__}" if packet is not None else str(op)


def _op_by_dispatch(res: Divergence, module: nn.Module, cand: Callable, call: _Call) -> None:
    logs = []
    for fn in (module, cand):
        log = _OpLog()
        with torch.no_grad(), log:
            fn(*_clone(call.args), **_clone(call.kwargs))
        logs.append(log.ops)
    eager, other = logs
    for i, ((ne, oe), (nc, oc)) in enumerate(zip(eager, other)):
        if ne != nc:
            res.op, res.op_index = nc, i
            res.op_delta = Delta(note=f"eager runs {ne} here, the candidate {nc}")
            res.eager_ops = [n for n, _ in eager[i:]]
            res.candidate_ops = [n for n, _ in other[i:]]
            res.rewrite = f"the candidate replaces eager's {', '.join(res.eager_ops[:6])} with " \
                          f"{', '.join(res.candidate_ops[:3])}"
            return
        d = compare(oe, oc)
        if not d.identical:
            res.op, res.op_index, res.op_delta = ne, i, d
            res.rewrite = f"{ne} computes other bits on the same inputs"
            return


# ---- the op: compiled candidates (prefix graphs) -----------------------------------------

_NO_COMPUTE = {"view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "unsqueeze",
               "squeeze", "slice", "select", "detach", "alias", "clone", "contiguous", "split",
               "split_with_sizes", "unbind", "as_strided", "_to_copy_noop", "lift_fresh_copy",
               "getitem", "size", "dim", "stride"}


def _trace(module: nn.Module, call: _Call) -> tuple[torch.fx.GraphModule, list[Tensor]]:
    """The module's call as a graph of ATen ops over its tensor inputs (the rest fixed)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    flat, spec = pytree.tree_flatten((call.args, call.kwargs))
    idx = [i for i, v in enumerate(flat) if isinstance(v, Tensor)]

    def fn(*tensors: Tensor) -> Any:
        vals = list(flat)
        for i, t in zip(idx, tensors):
            vals[i] = t
        a, kw = pytree.tree_unflatten(vals, spec)
        return module(*a, **kw)

    tensors = [flat[i] for i in idx]
    with torch.no_grad():
        gm = make_fx(fn)(*_clone(tensors))
    return gm, tensors


def _prefix(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in gm.graph.nodes:
        if n.op == "output":
            break
        env[n] = g.node_copy(n, lambda x: env[x])
        if n is node:
            break
    g.output(env[node])
    pg = torch.fx.GraphModule(gm, g)
    pg.graph.eliminate_dead_code()
    pg.recompile()
    return pg


def _compile_run(backend: Any, gm: torch.fx.GraphModule, tensors: list[Tensor],
                 options: dict | None = None) -> Any:
    torch._dynamo.reset()
    kw = {"options": options} if options else {}
    fn = torch.compile(gm, backend=backend, fullgraph=True, **kw)
    with torch.no_grad():
        return fn(*_clone(tensors))


def _dynamo_graphs(module: nn.Module, call: _Call) -> list[tuple[torch.fx.GraphModule, list]]:
    """The graphs dynamo captures from the module's call (data-dependent Python splits them),
    each with the inputs it was called with."""
    graphs: list[tuple[torch.fx.GraphModule, list]] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        graphs.append((gm, _clone(list(example_inputs))))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(module, backend=capture)(*_clone(call.args), **_clone(call.kwargs))
    torch._dynamo.reset()
    return graphs


def _node_name(n: torch.fx.Node) -> str:
    if n.op == "call_method":
        return f"Tensor.{n.target}"
    t = n.target
    packet = getattr(t, "overloadpacket", None)
    if packet is not None:
        return _qualified(t)
    mod = getattr(t, "__module__", None) or ""
    name = getattr(t, "__name__", str(t))
    return f"{mod.replace('torch._C._nn', 'torch.nn.functional')}.{name}" if mod else name


def _first_differing_node(gm: torch.fx.GraphModule, tensors: list, backend: Any,
                          max_ops: int) -> tuple[torch.fx.Node, torch.fx.GraphModule, Delta, Any] | None:
    env: dict[str, Any] = {}

    class Rec(torch.fx.Interpreter):
        def run_node(self, n):
            v = super().run_node(n)
            env[n.name] = _clone(v)
            return v

    with torch.no_grad():
        Rec(gm).run(*_clone(tensors))
    def computes(n: torch.fx.Node) -> bool:
        name = (n.target if isinstance(n.target, str) else
                getattr(getattr(n.target, "overloadpacket", None), "__name__", None)
                or getattr(n.target, "__name__", ""))
        return (n.op in ("call_function", "call_method") and name not in _NO_COMPUTE
                and any(isinstance(v, Tensor) for v in pytree.tree_leaves(env.get(n.name))))

    nodes = [n for n in gm.graph.nodes if computes(n)]
    for n in nodes[:max_ops]:
        pg = _prefix(gm, n)
        d = compare(env[n.name], _compile_run(backend, pg, tensors))
        if not d.identical:
            return n, pg, d, env[n.name]
    return None


def _op_by_prefix(res: Divergence, module: nn.Module, call: _Call, candidate: str,
                  max_ops: int) -> None:
    backend = _backend_fn(candidate)
    try:
        graphs = [_trace(module, call)]
        how = "ATen ops"
    except Exception:   # data-dependent Python (a transformers model's mask code), ...
        # dynamo's own graphs of the call instead (split where the Python is data-dependent)
        graphs = _dynamo_graphs(module, call)
        how = "dynamo's graphs"
    for gm, tensors in graphs:
        found = _first_differing_node(gm, tensors, backend, max_ops)
        if found is None:
            continue
        n, pg, d, want = found
        res.op, res.op_delta = _node_name(n), d
        res.op_index = [x for x in gm.graph.nodes].index(n)
        if candidate == "inductor":
            res.rewrite = _which_switch(pg, tensors, want, res.op)
        elif candidate == "exact":
            res.rewrite = "exact compile itself: an op it does not yet keep eager's (report it)"
        return
    res.rewrite = (f"no single op's value differs when the module is traced alone (as {how}); "
                   "the difference needs the module's calls as the model makes them")


def _which_switch(pg: torch.fx.GraphModule, tensors: list[Tensor], want: Any, op: str) -> str:
    """Which one of exact compile's switches makes this prefix equal to eager."""
    from . import exact
    trials = [
        ("a pattern replacement (inductor's pattern matcher; exact compile turns it off)",
         exact.make_backend({"pattern_matcher": False}, eager_ops=False)),
        ("a dropped intermediate rounding (inductor computes fused bf16/f16 ops in f32; "
         "exact compile emulates eager's casts)",
         exact.make_backend({"emulate_precision_casts": True}, eager_ops=False)),
        ("approximate division (exact compile rounds division as eager does)",
         exact.make_backend({k: v for k, v in exact.exact_config().items()
                             if k.startswith("eager_numerics.")}, eager_ops=False)),
        (f"inductor's own lowering or decomposition of {op} (another reduction order or formula; "
         "exact compile runs eager's kernel for it)",
         exact.make_backend({}, eager_ops=True)),
        ("several of inductor's rewrites together (the whole exact backend makes it equal)",
         exact.backend),
    ]
    for why, b in trials:
        if compare(want, _compile_run(b, pg, tensors)).identical:
            return why
    return "not one of exact compile's switches: exact compile differs here too (report it)"


# ---- the command line ---------------------------------------------------------------------

def _load(args: argparse.Namespace) -> tuple[nn.Module, Any, dict]:
    dtype = DTYPE_OF_NAME[args.dtype]
    if args.seed_model:
        from . import seeds
        m, x = seeds.build(args.seed_model, dtype, args.device)
        return m, x, {}
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device).eval()
    text = open(args.text, encoding="utf-8").read() if args.text else "kernelize names the op."
    ids = torch.tensor([list(text.encode("utf-8"))[: args.max_tokens]], device=args.device)
    return m, ids, {"use_cache": False}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="kernelize diff",
        description="Name the first module and op where a candidate (a torch.compile backend, or "
                    "kernelize's kernels) departs from eager on your model, and the rewrite "
                    "responsible. Exit 0 when identical, 1 when a divergence was found.",
        epilog="examples:\n"
               "  kernelize diff --seed-model linear_layer_norm --dtype f32 --device cuda\n"
               "  kernelize diff --model models/tiny-llama --candidate inductor --device cuda\n"
               "  kernelize diff --model models/tiny-llama --candidate kernelize "
               "--kernels-dir kernels --device cuda",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a Hugging Face model folder (byte-tokenised models: "
                                     "config.json says kernelize_tokenizer=bytes)")
    src.add_argument("--seed-model", choices=["attention", "einsum_mha", "linear_layer_norm"],
                     help="one of the project's three seed models (docs/compile.md)")
    p.add_argument("--candidate", default="inductor",
                   help="inductor (plain torch.compile, default), exact (kernelize's exact "
                        "compile), kernelize (the model kernelized from --kernels-dir or --hub), "
                        "or another torch.compile backend name")
    p.add_argument("--kernels-dir", help="kernel folders for --candidate kernelize")
    p.add_argument("--hub", help="a hub URL for --candidate kernelize")
    p.add_argument("--dtype", choices=list(DTYPE_OF_NAME), default="bf16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--text", help="text to feed a --model (default: one sentence)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--no-ops", action="store_true", help="stop at the module (no op search)")
    p.add_argument("--json", help="also write the answer as JSON to this file")
    a = p.parse_args(argv)
    model, x, kw = _load(a)
    cand: Any = a.candidate
    if a.candidate == "kernelize":
        if not (a.kernels_dir or a.hub):
            p.error("--candidate kernelize needs --kernels-dir DIR or --hub URL")
        from .core import kernelize
        cand = copy.deepcopy(model)
        kernelize(cand, hub=a.hub, kernels_dir=a.kernels_dir)
    res = diff(model, x, cand, kwargs=kw, ops=not a.no_ops)
    print(res)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(res.to_json(), f, indent=1, default=str)
    return 0 if res.identical else 1


if __name__ == "__main__":
    sys.exit(main())
