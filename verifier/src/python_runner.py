"""The child side of kernelize's Python candidate runner (SPEC 2b; verifier/src/python.rs).

The verifier starts `python3 -I THIS_FILE` in a private temporary directory and speaks JSON lines
over stdin/stdout, one request, one answer, in the shapes of python.rs's `PyRequest` and
`PyResponse` (serde's externally tagged enums: `{"load": {...}}` -> `{"loaded": {...}}`,
`{"case": {...}}` -> `{"case": {...}}`, any failure -> `{"error": {"kind": ..., "message": ...}}`).
Tensors travel as raw little-endian files in the case's folder, never through the pipe.

It loads the candidate's source, calls its function on the case's inputs (each in its own dtype)
and checks what the verifier cannot see from outside: inputs unchanged, each output's type,
shape, dtype and device (a backward op's gradients come as a tuple, the case's `outputs` in
order), every element written (stale memory of PyTorch's caching allocator poisoned before each
call, one block per output), new memory every call, the same bits with the inputs at other
addresses (the address cases, `placed`), in batches (`batch`) and when timed (`timed`). The
measurements against the reference and the oracle are the verifier's, in Rust.
"""

import importlib.metadata
import importlib.util
import json
import os
import re
import sys
import time
import traceback

PROTOCOL = sys.stdout
# The candidate's prints must not corrupt the protocol: everything else goes to stderr.
sys.stdout = sys.stderr

torch = None
DEVICE = None
MODULE = None
DTYPES = {}


class Failure(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind
        self.message = message


# What the runner's checks rely on, captured (`guard_objects`, into GUARD) before the candidate
# is imported and compared (`check_guard`) after the import, after every untimed call and once
# after the timed calls: a candidate that replaces one of them (to hide a modified input, fake a
# timing or a comparison) fails the case. Best effort: code in this process can always change it
# in ways this does not see (docs/spec.md section 2b, docs/python-candidates.md).
GUARDED_RUNNER = ("answer", "bits", "same_bits", "sync", "poison", "call", "run_case", "batch",
                  "timed", "write_tensor", "read_tensor", "check_guard", "rolled", "rowwise", "PROTOCOL",
                  "as_outputs", "same_outputs", "same_values", "want_shape", "out_bytes",
                  "placed", "difference")
GUARD = {}


def guard_objects():
    import builtins
    g = globals()
    objs = {f"runner `{n}`": g[n] for n in GUARDED_RUNNER}
    objs.update({f"torch.{n}": getattr(torch, n) for n in
                 ("equal", "empty", "randint", "bitwise_not", "tensor", "frombuffer", "roll", "no_grad",
                  "isnan", "isfinite")})
    for n in ("clone", "contiguous", "view", "copy_", "index_select", "any", "sum", "__ne__",
              "__eq__", "__xor__", "cpu", "numpy", "nonzero", "flatten", "to", "zero_",
              "data_ptr", "numel", "element_size", "__getitem__", "__and__", "__invert__", "abs",
              "max", "float", "neg", "__or__", "all"):
        objs[f"torch.Tensor.{n}"] = getattr(torch.Tensor, n)
    if hasattr(torch, "cuda"):
        objs["torch.cuda.synchronize"] = torch.cuda.synchronize
        objs["torch.cuda.Event"] = torch.cuda.Event
        objs["torch.cuda.Event.record"] = torch.cuda.Event.record
        objs["torch.cuda.Event.elapsed_time"] = torch.cuda.Event.elapsed_time
    objs.update({"json.dumps": json.dumps, "time.perf_counter": time.perf_counter,
                 "builtins.open": builtins.open, "builtins.isinstance": builtins.isinstance,
                 "builtins.int": builtins.int, "builtins.bool": builtins.bool})
    return objs


def check_guard(what):
    changed = sorted(k for k, v in guard_objects().items() if GUARD.get(k) is not v)
    if changed:
        raise Failure("wrong_output", f"{what} changed the verifier's process: {', '.join(changed)} "
                      "replaced (a candidate must not patch the runner or torch)")


def answer(obj):
    PROTOCOL.write(json.dumps(obj) + "\n")
    PROTOCOL.flush()


def confinement():
    """The verifier's confinement check (verifier/src/confinement.py), which it writes beside
    this file; loaded from there without touching sys.path."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernelize_confinement.py")
    spec = importlib.util.spec_from_file_location("kernelize_confinement", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(req):
    global torch, DEVICE, MODULE, DTYPES
    # Before anything of the candidate (its package folders, its source) is on the path or run:
    # what isolation this process has, and a refusal when it is required and missing.
    isolation = confinement().isolation(
        f"working directory {os.getcwd()} (private, removed after the run)")
    if req.get("require_network_isolation") and not isolation[0].startswith("isolated"):
        raise Failure("isolation", f"the Python child is not network-isolated ({isolation[0]})")
    for d in req["package_dirs"]:
        sys.path.insert(0, d)
    try:
        import torch as t
    except Exception as e:  # noqa: BLE001 - reported to the verifier
        raise Failure("import", f"cannot import torch: {e}") from None
    torch = t
    DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    if req["device"] == "cuda":
        if not torch.cuda.is_available():
            raise Failure("import", "torch.cuda.is_available() is False in the child")
        DEVICE = torch.device("cuda", 0)
        # The GPU's figures a backward verdict depends on (rms_norm_backward's dw order), read
        # before anything of the candidate is loaded.
        props = torch.cuda.get_device_properties(DEVICE)
        tps = getattr(props, "max_threads_per_multi_processor", None)
        device = {"name": props.name, "sms": int(props.multi_processor_count),
                  "threads_per_sm": None if tps is None else int(tps)}
    else:
        DEVICE = torch.device("cpu")
        device = None
    spec = importlib.util.spec_from_file_location("kernelize_candidate", req["source_path"])
    MODULE = importlib.util.module_from_spec(spec)
    sys.modules["kernelize_candidate"] = MODULE  # importable by name (Dynamo reads globals so)
    GUARD.clear()
    GUARD.update(guard_objects())
    try:
        spec.loader.exec_module(MODULE)
    except BaseException:  # noqa: BLE001 - anything the source raises is the candidate's
        raise Failure("import", "importing the candidate failed:\n" + traceback.format_exc(limit=8)) from None
    try:
        check_guard("importing the candidate")
    except Failure as f:
        raise Failure("import", f.message) from None
    for dtype, fn in req["entries"].items():
        if not callable(getattr(MODULE, fn, None)):
            raise Failure("import", f"entry.{dtype}: the source defines no callable `{fn}`")
    for dtype, fn in req.get("setup", {}).items():
        if not callable(getattr(MODULE, fn, None)):
            raise Failure("import", f"setup.{dtype}: the source defines no callable `{fn}`")
    packages = {}
    for r in req["requires"]:
        name = re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", r).group(0)).lower()
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            packages[name] = "torch " + torch.__version__ if name == "torch" else "missing"
    if "torch" in packages and packages["torch"].startswith("torch "):
        packages["torch"] = torch.__version__
    loaded = {"python": sys.version.split()[0], "torch": torch.__version__,
              "packages": packages, "isolation": isolation}
    if device is not None:
        loaded["device"] = device
    return {"loaded": loaded}


def read_tensor(folder, t, dtype):
    """Input `t` of the case (python.rs's PyTensor) in its own dtype (layer_norm_backward's
    mean and rstd are f32 in every case dtype); `dtype`, the case's, where it names none."""
    with open(os.path.join(folder, t["name"] + ".bin"), "rb") as f:
        raw = bytearray(f.read())
    return torch.frombuffer(raw, dtype=DTYPES[t.get("dtype") or dtype]).reshape(t["shape"]).to(DEVICE)


def write_tensor(folder, name, t):
    with open(os.path.join(folder, name + ".bin"), "wb") as f:
        f.write(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())


def bits(t):
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def same_bits(a, b):
    return a.shape == b.shape and bool(torch.equal(bits(a), bits(b)))


def sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def poison(sizes, seed, invert):
    """Fill fresh device memory, one buffer of each of `sizes` bytes (one per output of the
    call), with a pattern and hand it back to the caching allocator, so that the outputs the
    candidate allocates next (torch.empty) most likely start out holding it. The second launch
    uses the inverted pattern: an element never written then holds bits that are the exact
    complement of launch 1's."""
    g = torch.Generator(device=DEVICE).manual_seed(seed & 0x7FFFFFFFFFFFFFFF)
    bufs = []
    for nbytes in sizes:
        buf = torch.randint(0, 256, (max(nbytes, 16),), dtype=torch.uint8, device=DEVICE, generator=g)
        if invert:
            torch.bitwise_not(buf, out=buf)
        bufs.append(buf)
    sync()
    bufs.clear()


def want_shape(t, rows):
    """The shape output `t` of the case (python.rs's PyTensor) has in a call on `rows` rows: a
    row-wise one's first dimension is the call's rows (a batch's in a batch)."""
    return [rows] + list(t["shape"][1:]) if t["rowwise"] else list(t["shape"])


def out_bytes(c, rows):
    """Each output's bytes in a call on `rows` rows, in the case's `outputs` order."""
    es = torch.empty((), dtype=DTYPES[c["dtype"]]).element_size()
    sizes = []
    for t in c["outputs"]:
        n = 1
        for d in want_shape(t, rows):
            n *= d
        sizes.append(n * es)
    return sizes


def as_outputs(out, c, what):
    """What a call returned as the list of the case's outputs: one tensor, or (a backward op,
    `returns_tuple`) a tuple or list of exactly as many as the case has (one may come bare)."""
    names = [t["name"] for t in c["outputs"]]
    if not c.get("returns_tuple"):
        return [out]
    if isinstance(out, torch.Tensor) and len(names) == 1:
        return [out]
    if not isinstance(out, (tuple, list)):
        raise Failure("wrong_output", f"{what} returned {type(out).__name__}, not a tuple of "
                      f"{len(names)} tensors ({', '.join(names)})")
    if len(out) != len(names):
        raise Failure("wrong_output", f"{what} returned {len(out)} values, expected {len(names)} "
                      f"({', '.join(names)})")
    return list(out)


def call(fn, args, c, what, rows):
    """One call of the candidate on `rows` rows: its outputs, in the case's `outputs` order,
    each checked (a tensor of its shape, dtype and device, complete in the caller's stream
    order) and contiguous."""
    snaps = None
    try:
        with torch.no_grad():
            out = fn(*args)
            # A copy queued on the caller's stream right away: it sees the output as the next op
            # of a model would. Work left on another stream that the caller's stream does not
            # wait for is a race: the copy then differs from the output read after a device-wide
            # synchronisation.
            if DEVICE.type == "cuda":
                snaps = [o.detach().clone() if isinstance(o, torch.Tensor) and o.device.type == "cuda"
                         else None for o in (out if isinstance(out, (tuple, list)) else (out,))]
        sync()
    except BaseException:  # noqa: BLE001 - the candidate's exception, reported as such
        raise Failure("exception", f"{what} raised:\n" + traceback.format_exc(limit=6)) from None
    check_guard(what)
    outs = as_outputs(out, c, what)
    dtype = DTYPES[c["dtype"]]
    for i, (o, t) in enumerate(zip(outs, c["outputs"])):
        # A backward op's outputs are named; a forward op's one is "the output".
        of = f" `{t['name']}` with" if c.get("returns_tuple") else ""
        want = want_shape(t, rows)
        if not isinstance(o, torch.Tensor):
            what_o = f"{what} returned `{t['name']}` as" if of else f"{what} returned"
            raise Failure("wrong_output", f"{what_o} {type(o).__name__}, not a tensor")
        if list(o.shape) != want:
            raise Failure("wrong_output", f"{what} returned{of} shape {list(o.shape)}, expected {want}")
        if o.dtype != dtype:
            raise Failure("wrong_output", f"{what} returned{of} dtype {o.dtype}, expected {dtype}")
        if o.device.type != DEVICE.type:
            where = f"`{t['name']}` on" if of else "a tensor on"
            raise Failure("wrong_output", f"{what} returned {where} {o.device}, expected {DEVICE}")
        snap = snaps[i] if snaps is not None and i < len(snaps) else None
        if snap is not None and not same_bits(snap, o):
            n = int((bits(snap.contiguous()) != bits(o.contiguous())).sum())
            name = f"`{t['name']}`" if of else "an output"
            raise Failure("wrong_output", f"{what} returned {name} that was not complete in the caller's "
                          f"stream order ({n} elements changed after the call returned): work on another "
                          "stream that the current stream does not wait for")
    return [o.contiguous() for o in outs]


def entry_of(c):
    """The case's function as the calls below make it, and `prepare(args)` -> a call with no
    arguments. Without a setup (`[setup]`, docs/spec.md section 2b) the call is the entry on
    `args`. With one, `prepare` first runs the setup on the arguments that are not incoming
    gradients (`setup_args`: what a forward had, e.g. x, w, eps) and the call passes its state
    to the entry as the last argument: the timed calls prepare before their timer starts, so
    what the backward reads from a forward (Liger's RSTD, an autograd graph) is not timed; the
    untimed calls prepare anew for every call, on that call's tensors."""
    fn = getattr(MODULE, c["function"])
    if not c.get("setup"):
        return fn, lambda args: (lambda: fn(*args))
    setup = getattr(MODULE, c["setup"])
    at = [c["args"].index(a) for a in c["setup_args"]]

    def prepare(args):
        try:
            state = setup(*[args[i] for i in at])
        except BaseException:  # noqa: BLE001 - the candidate's exception, reported as such
            raise Failure("exception", f"the setup `{c['setup']}` raised:\n"
                          + traceback.format_exc(limit=6)) from None
        return lambda: fn(*args, state)

    return (lambda *args: prepare(args)()), prepare


def run_case(c):
    fn, prepare = entry_of(c)
    folder = c["dir"]
    inputs = {t["name"]: read_tensor(folder, t, c["dtype"]) for t in c["inputs"]}
    pristine = {k: v.clone() for k, v in inputs.items()}
    mutable = set(c["mutable"])
    eps = c["eps"]
    names = [t["name"] for t in c["outputs"]]
    tuple_ = bool(c.get("returns_tuple"))

    def args_of(tensors):
        return [eps if a == "eps" else tensors[a] for a in c["args"]]

    sizes = out_bytes(c, c["rows"])
    integrity, unwritten, files = [], [], []
    first = first_res = None
    held = []  # every call's outputs (call, name, tensor), kept alive as a caller that still uses them would
    for k in range(c["launches"]):
        for name in mutable:
            inputs[name].copy_(pristine[name])
        sync()
        poison(sizes, c["poison_seed"], invert=(k == 1))
        outs = call(fn, args_of(inputs), c, f"call {k + 1} of `{c['function']}`", c["rows"])
        for name, out in zip(names, outs):
            ptr = out.untyped_storage().data_ptr()
            for j, h_name, h in held:
                if h.untyped_storage().data_ptr() == ptr:
                    if tuple_:
                        integrity.append(f"{name}: call {k + 1} returned the memory of call {j + 1}'s `{h_name}`, "
                                         "which the caller still holds (each call must return new tensors)")
                    else:
                        integrity.append(f"output: call {k + 1} returned the memory of call {j + 1}'s output, "
                                         "which the caller still holds (each call must return a new tensor)")
                    break
        held.extend((k, name, out) for name, out in zip(names, outs))
        files.append([])
        for name, out in zip(names, outs):
            write_tensor(folder, f"{name}{k}", out)
            files[-1].append(f"{name}{k}")
        for name in sorted(mutable):
            write_tensor(folder, f"{name}{k}", inputs[name])
        for name, t in inputs.items():
            if name not in mutable and not same_bits(t, pristine[name]):
                n = int((bits(t) != bits(pristine[name])).sum())
                integrity.append(f"input `{name}`: {n} elements changed by call {k + 1} (inputs must not be modified)")
                t.copy_(pristine[name])
        if k == 0:
            first = {name: out.clone() for name, out in zip(names, outs)}
            first_res = {name: inputs[name].clone() for name in mutable}
        elif k == 1:
            # Never written: launch 2's bits are the exact complement of launch 1's poison.
            for name, out in zip(names, outs):
                complement = (bits(first[name]) ^ bits(out)) == -1
                n = int(complement.sum())
                if n:
                    at = int(complement.flatten().nonzero()[0])
                    unwritten.append({"tensor": name, "count": n, "first": at})
    del held, outs
    result = {"outputs": files, "integrity": integrity, "unwritten": unwritten, "batch": None,
              "timed": None, "address": None}
    if c["compositions"]:
        result["batch"] = batch(fn, c, inputs, pristine, mutable, first, first_res, args_of)
    if c.get("placements"):
        result["address"] = placed(fn, c, pristine, mutable, first, first_res, args_of)
    if c["speed_reps"]:
        result["timed"] = timed(prepare, c, inputs, pristine, mutable, first, args_of)
    return {"case": result}


def difference(name, got, want):
    """How `got` differs from `want` bit for bit (NaN == NaN), as measure::address::Difference;
    None when it does not."""
    a, b = got.contiguous().flatten(), want.contiguous().flatten()
    diff = (bits(a) != bits(b)) & ~(torch.isnan(a) & torch.isnan(b))
    n = int(diff.sum())
    if not n:
        return None
    finite = diff & torch.isfinite(a) & torch.isfinite(b)
    mad = float((a[finite].float() - b[finite].float()).abs().max()) if bool(finite.any()) else None
    return {"tensor": name, "differ": n, "elements": a.numel(), "first": int(diff.nonzero()[0]),
            "max_abs_diff": mad}


def placed(fn, c, pristine, mutable, first, first_res, args_of):
    """The address cases (docs/spec.md section 3, issue 26): the call again with every input at
    other addresses the ABI allows (python.rs sends measure::address::plan: each input's address
    residue modulo c["address_period"]), each a view into a larger allocation; every output (and
    an updated residual) must have the first call's bits. The first placement that differed and
    how, and how many did; None when none did."""
    period = c["address_period"]
    names = [t["name"] for t in c["inputs"]]
    found, differing = None, 0
    for i, residues in enumerate(c["placements"]):
        moved, stores = {}, []
        for name, r in zip(names, residues):
            t = pristine[name]
            nbytes = t.numel() * t.element_size()
            store = torch.empty(nbytes + period + 64, dtype=torch.uint8, device=DEVICE)
            off = (r - store.data_ptr()) % period
            v = store[off:off + nbytes].view(t.dtype).view(t.shape)
            v.copy_(t)
            moved[name] = v
            stores.append(store)
        where = ", ".join(f"{n} at {r} mod {period}" for n, r in zip(names, residues))
        outs = call(fn, args_of(moved), c, f"`{c['function']}` with {where}", c["rows"])
        diffs = [difference(t["name"], out, first[t["name"]]) for t, out in zip(c["outputs"], outs)]
        diffs += [difference(name, moved[name], first_res[name]) for name in sorted(mutable)]
        diffs = [d for d in diffs if d]
        if diffs:
            differing += 1
            if found is None:
                found = {"placement": i, "diffs": diffs}
        del moved, stores, outs
    if found:
        found["differing"] = differing
    return found


def batch(fn, c, inputs, pristine, mutable, first, first_res, args_of):
    """Every row again in other batch compositions (python.rs sends verifier's batch::plan, and
    only where every output is row-wise); the first row whose bits differ in any output from the
    case's own call, if any."""
    by_row = rowwise(c)
    for comp in c["compositions"]:
        for b in comp["batches"]:
            idx = torch.tensor(b, dtype=torch.long, device=DEVICE)
            sub = {k: (pristine[k].index_select(0, idx).clone() if k in by_row else pristine[k])
                   for k in inputs}
            outs = call(fn, args_of(sub), c, f"`{c['function']}` on a batch of {len(b)} rows", len(b))
            diff = torch.zeros(len(b), dtype=torch.bool, device=DEVICE)
            for t, out in zip(c["outputs"], outs):
                if t["rowwise"]:
                    want = first[t["name"]].index_select(0, idx)
                    diff |= (bits(out) != bits(want)).reshape(len(b), -1).any(dim=1)
            if mutable:
                (name,) = mutable
                diff |= (bits(sub[name]) != bits(first_res[name].index_select(0, idx))).any(dim=1)
            if bool(diff.any()):
                j = int(diff.nonzero()[0])
                return (f"not batch-invariant: row {b[j]} differs when computed in composition "
                        f"`{comp['name']}` (a batch of {len(b)} rows, at position {j})")
    return None


def rowwise(c):
    """The names of the case's inputs whose first dimension is its rows (python.rs's
    `PyTensor::rowwise`: x, dy, layer_norm_backward's mean and rstd; not weight or bias)."""
    return {t["name"] for t in c["inputs"]
            if t["rowwise"]}


def rolled(t, k, rows):
    """`t`, one of the case's row-major tensors, with its rows rotated by `k`."""
    return torch.roll(t, k, 0) if t.dim() >= 1 and t.shape[0] == rows and rows > 1 else t


def same_values(a, b):
    """`a` has `b`'s bits, but for the sign of a zero and a NaN's bits (what negating the
    incoming gradients may leave: (+0) + (-0) is +0 either way)."""
    a, b = a.contiguous(), b.contiguous()
    if a.shape != b.shape:
        return False
    same = (bits(a) == bits(b)) | ((a == 0) & (b == 0)) | (torch.isnan(a) & torch.isnan(b))
    return bool(same.all())


def same_outputs(out, want, c, negated):
    """Whether what a timed call returned is the case's outputs with exactly `want`'s bits
    (`negated`: `want`'s values, the sign of a zero and NaN bits aside)."""
    try:
        outs = as_outputs(out, c, "")
    except Failure:
        return False
    same = same_values if negated else same_bits
    return all(isinstance(o, torch.Tensor) and same(o.contiguous(), w) for o, w in zip(outs, want))


def timed(prepare, c, inputs, pristine, mutable, first, args_of):
    """Median time of `speed_reps` calls with the L2 flushed before each (each call prepared by
    `entry_of`'s `prepare` before the flush: a setup is not timed); every timed call's
    outputs are checked. Timed call `r` gets the case's rows rotated by `r + 1` (in the same
    tensors, written before the timer starts), so that a candidate which keeps an earlier
    output (by address, by version or by content) and hands it back is wrong, not fast; its
    outputs must be the first call's rows rotated alike (rows are computed independently).
    Where an output is not row-wise (a backward op's `dw`, `db`: sums over the rows, whose
    order a rotation changes) or the case has one row, the rows are not rotated: every other
    timed call gets the incoming gradients (`negate`: dy, dres) negated instead, and must give
    every output negated (each gradient is linear in them and rounded symmetrically; the sign
    of a zero and NaN bits aside), the others call 1's bits. A kept output handed back is then
    wrong every other call.

    One more call, at a position drawn from the case's seed among the timed ones and made the
    same way (events around it), is not timed: a copy of its outputs is queued on the caller's
    stream right after the end event and compared after a synchronisation, as `call` does, so
    that work left on another stream only when timed is caught. Its time is left out because the
    copy and the comparison slow the next call's dispatch (measured on the H200: about 20 us for
    a torch.compile'd LayerNorm at 4096x8192)."""
    reps = c["speed_reps"]
    rows = c["rows"]
    by_row = rowwise(c)
    names = [t["name"] for t in c["outputs"]]
    rotate = rows > 1 and all(t["rowwise"] for t in c["outputs"])
    negate = set() if rotate else set(c.get("negate", ()))
    sizes = out_bytes(c, rows)
    check_at = c["poison_seed"] % (reps + 1)
    if DEVICE.type == "cuda":
        l2 = torch.cuda.get_device_properties(DEVICE).L2_cache_size
        flush = torch.empty(max(2 * l2, 1 << 20), dtype=torch.uint8, device=DEVICE)
    times, bad = [], []
    for call_no in range(reps + 1):
        checked = call_no == check_at
        rep = call_no - (call_no > check_at)  # the timed call's index; the checked one's: its slot
        k = (call_no + 1) % rows if rotate else 0
        flip = bool(negate) and call_no % 2 == 1
        for name, t in inputs.items():
            if name in mutable or name in by_row or name in negate:
                v = rolled(pristine[name], k, rows)
                t.copy_(v.neg() if flip and name in negate else v)
        want = [rolled(first[n], k, rows) for n in names]
        if flip:
            want = [w.neg() for w in want]
        poison(sizes, c["poison_seed"] + call_no + 2, invert=False)
        with torch.no_grad():
            go = prepare(args_of(inputs))
        snaps = None
        if DEVICE.type == "cuda":
            flush.zero_()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            with torch.no_grad():
                out = go()
            end.record()
            if checked:
                snaps = [(o, o.detach().clone()) for o in (out if isinstance(out, (tuple, list)) else (out,))
                         if isinstance(o, torch.Tensor) and o.is_cuda]
            torch.cuda.synchronize()
            if not checked:
                times.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            with torch.no_grad():
                out = go()
            if not checked:
                times.append((time.perf_counter() - t0) * 1e6)
        if snaps is not None and not all(same_bits(s, o) for o, s in snaps):
            raise Failure("wrong_output", f"a timed call of `{c['function']}` returned an output that was not "
                          "complete in the caller's stream order: work on another stream that the current "
                          "stream does not wait for (the CUDA events did not time it)")
        if not same_outputs(out, want, c, flip):
            # The checked call counts as the timed slot it took (the last one when it came last).
            bad.append(min(rep, reps - 1))
    # Once for the timed calls, not between them: a replaced function stays replaced, and work
    # between timed calls slows the next one's dispatch (see above).
    check_guard(f"the timed calls of `{c['function']}`")
    for name, t in inputs.items():
        t.copy_(pristine[name])
    times.sort()
    return {"median_us": times[len(times) // 2], "bad": sorted(set(bad))}


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            ((kind, body),) = json.loads(line).items()
            if kind == "load":
                answer(load(body))
            elif kind == "case":
                if MODULE is None:
                    raise Failure("protocol", "a case before load")
                answer(run_case(body))
            else:
                raise Failure("protocol", f"unknown request `{kind}`")
        except Failure as f:
            answer({"error": {"kind": f.kind, "message": f.message}})
        except BaseException:  # noqa: BLE001 - a bug of ours, or the candidate's beyond a call
            answer({"error": {"kind": "runner", "message": traceback.format_exc(limit=8)}})


if __name__ == "__main__":
    main()
