"""The knobs comm-tune sweeps and the grid of settings: libcomm's (environment variables the
runtime honours, and the profile's knob names) and NCCL's (validated as NCCL requires)."""
import itertools
import json

# profile knob -> (environment variable, scope, min, max); algo is a name, not a number.
# The bounds are libcomm's own (libcomm/src/tuning/profile.cc).
LIBCOMM_KNOBS = {
    "algo": ("COMM_ALGO", "call", None, None),
    "chunk_bytes": ("COMM_CHUNK_BYTES", "call", 4096, 1 << 30),
    "shm_chunk_bytes": ("COMM_SHM_CHUNK_BYTES", "call", 4096, 1 << 30),
    "shm_slot_bytes": ("COMM_SHM_SLOT_BYTES", "communicator", 64, 16 << 20),
    "socket_nconns": ("COMM_SOCKET_NCONNS", "communicator", 1, 8),
    # The gradient engine's (--engine: measured through engine-bench, keyed by the model's bytes).
    "bucket_cap_bytes": ("COMM_ENGINE_BUCKET_CAP_BYTES", "engine", 1, 1 << 40),
    "first_bucket_bytes": ("COMM_ENGINE_FIRST_BUCKET_BYTES", "engine", 1, 1 << 40),
}

# NCCL's knobs, with what NCCL accepts. They are set in the environment of fresh ranks, since
# NCCL reads its environment once, at init.
NCCL_KNOBS = {
    "NCCL_ALGO": ("Tree", "Ring", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"),
    "NCCL_PROTO": ("LL", "LL128", "Simple"),
    "NCCL_MIN_CTAS": (1, 64), "NCCL_MAX_CTAS": (1, 64),
    "NCCL_MIN_NCHANNELS": (1, 64), "NCCL_MAX_NCHANNELS": (1, 64),
    "NCCL_BUFFSIZE": (1 << 12, 1 << 30),
    "NCCL_SOCKET_NTHREADS": (1, 16), "NCCL_NSOCKS_PERTHREAD": (1, 64),
    "NCCL_IB_QPS_PER_CONNECTION": (1, 128),
}


class GridError(ValueError):
    pass


def parse_value(text):
    text = text.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in mult and text[:-1].isdigit():
        return int(text[:-1]) * mult[text[-1].upper()]
    return int(text) if text.lstrip("-").isdigit() else text


def axes_from_args(specs):
    """--grid 'chunk_bytes=32K,128K' (repeatable) -> {knob: [values]}."""
    axes = {}
    for spec in specs:
        if "=" not in spec:
            raise GridError(f"--grid '{spec}': write KNOB=V1,V2,...")
        knob, values = spec.split("=", 1)
        axes[knob.strip()] = [parse_value(v) for v in values.split(",") if v.strip()]
    return axes


def load_grid_file(path):
    """A JSON file: {"axes": {knob: [values]}} (a product) or {"settings": [{knob: value}, ...]}."""
    with open(path) as f:
        spec = json.load(f)
    if "settings" in spec:
        return [dict(s) for s in spec["settings"]]
    if "axes" in spec:
        return product(spec["axes"])
    raise GridError(f"{path}: needs \"axes\" or \"settings\"")


def product(axes):
    names = list(axes)
    return [dict(zip(names, combo)) for combo in itertools.product(*(axes[n] for n in names))]


def validate_libcomm(setting, algos, engine=False):
    """Why `setting` is not a valid libcomm setting, or None. `algos`: names the runtime has;
    `engine`: the sweep runs engine-bench (--engine), whose knobs are the engine's only."""
    scopes = set()
    for knob, value in setting.items():
        if knob not in LIBCOMM_KNOBS:
            return f"unknown knob '{knob}' (libcomm knobs: {', '.join(LIBCOMM_KNOBS)}; NCCL's need --nccl)"
        _, scope, lo, hi = LIBCOMM_KNOBS[knob]
        if (scope == "engine") != engine:
            return (f"{knob} is an engine knob: sweep it with --engine (engine-bench)" if scope == "engine" else
                    f"{knob} is not an engine knob (--engine sweeps bucket_cap_bytes, first_bucket_bytes)")
        scopes.add(scope)
        if knob == "algo":
            if algos and value not in algos:
                return f"algo '{value}' is not an algorithm of this collective ({', '.join(algos)})"
        elif not isinstance(value, int) or not lo <= value <= hi:
            return f"{knob}={value} is out of range [{lo}, {hi}]"
    if len(scopes) > 1:
        return ("mixes per-call knobs with communicator knobs (shm_slot_bytes, socket_nconns): sweep those in "
                "a grid of their own, since the profile applies them to the whole communicator")
    return None


def validate_nccl(setting):
    """Why `setting` is not a valid NCCL setting, or None (NCCL's own rules)."""
    for knob, value in setting.items():
        allowed = NCCL_KNOBS.get(knob)
        if allowed is None:
            return f"unknown NCCL knob '{knob}' ({', '.join(NCCL_KNOBS)})"
        if isinstance(allowed[0], str):
            parts = str(value).lstrip("^").split(",")
            bad = [p for p in parts if p.split(":")[-1] not in allowed]
            if bad:
                return f"{knob}={value}: {', '.join(bad)} not in {', '.join(allowed)}"
        elif not isinstance(value, int) or not allowed[0] <= value <= allowed[1]:
            return f"{knob}={value} is out of range [{allowed[0]}, {allowed[1]}]"
    nt, ns = setting.get("NCCL_SOCKET_NTHREADS"), setting.get("NCCL_NSOCKS_PERTHREAD")
    if nt is not None and ns is not None and nt * ns > 64:
        return f"NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = {nt * ns} > 64 (NCCL's limit)"
    for lo, hi in (("NCCL_MIN_CTAS", "NCCL_MAX_CTAS"), ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS")):
        if lo in setting and hi in setting and setting[lo] > setting[hi]:
            return f"{lo}={setting[lo]} > {hi}={setting[hi]}"
    return None


def environment(setting, nccl=False):
    """The environment variables that apply `setting` in fresh ranks."""
    if nccl:
        return {k: str(v) for k, v in setting.items()}
    return {LIBCOMM_KNOBS[k][0]: str(v) for k, v in setting.items()}


def name(setting):
    return " ".join(f"{k}={v}" for k, v in setting.items()) or "default"


def slug(setting):
    return "_".join(f"{k}-{v}" for k, v in setting.items()).replace("/", "-") or "default"


def scope(setting):
    """call, communicator or engine; NCCL's settings act on the whole process, as communicator knobs do."""
    if any(k.startswith("NCCL_") for k in setting):
        return "communicator"
    scopes = {LIBCOMM_KNOBS.get(k, ("", "call"))[1] for k in setting}
    return "engine" if "engine" in scopes else "communicator" if "communicator" in scopes else "call"


# The algorithm registry's names per collective (libcomm/src/algorithms/registry.cc); libcomm
# checks them again when it loads the profile.
ALGORITHMS = {
    "allreduce": ["ring", "recursive_doubling", "shm_slots", "shm_direct", "hierarchical"],
    "broadcast": ["pipelined_chain", "binomial_tree"],
    "reduce": ["ring", "binomial_tree"],
    "allgather": ["ring", "recursive_doubling"],
    "reduce_scatter": ["ring"],
    "alltoall": ["pairwise"],
}
