"""CPU time per op kind of a headroom run, from a `perf record --call-graph dwarf` profile.

The runtime's kernels run on rayon pool threads, whose stacks end in the pool, not in the
`Tensor` op that started them, so a plain `perf report` puts most of the time under rayon
frames (and a memmove under "memmove", whoever called it). This walks each sample's
stack (inlined frames included) from the leaf up and charges the sample to the first
headroom frame (or inlined im2col / norm helper) that names an op kind: im2col, the conv's GEMM, its scatter, cat, norm,
SiLU, add, upsampling, copies, the seeded weight init. Page faults (the kernel zeroing
fresh pages on first touch) are charged to the op that touched the page and also
counted on their own.

    perf record -F 200 --call-graph dwarf,16384 -o run.data target/release/headroom bench vae
    perf script -i run.data -F tid,ip,sym > run.txt
    python3 tools/perf_ops.py run.txt --hz 200 [--other]

Prints, per op kind: share of samples, CPU seconds (samples / hz; summed over threads)
and the share of its samples spent in page faults.
"""

import argparse
import collections

# (op kind, substrings of a headroom frame), first match from the leaf wins.
RULES = [
    ("seeded weight init", ["ops::random"]),
    ("conv im2col", ["fill_cols", "fill_row", "fill_segment", "source_row", "im2col"]),
    ("conv scatter+bias", ["conv::tiled::{closure#2}", "conv::tiled::{closure_env#2}", "conv::pointwise::{closure"]),
    ("gemm operand packing", ["cpu::pack", "pack_a", "pack_b"]),
    ("gemm", ["conv::tiled::{closure_env#1}", "conv::pointwise", "gemm_packed", "kernels::gemm", "sgemm", "vdp"]),
    ("cat", ["::cat"]),
    ("zeros", ["Tensor::zeros"]),
    ("rms norm", ["rms_norm", "scale_row"]),
    ("silu / activation", ["activation::", "silu"]),
    ("add / elementwise", ["elementwise::"]),
    ("upsample", ["upsample"]),
    ("pad", ["::pad"]),
    ("copy / contiguous / to_dtype", ["copy_typed", "ops::copy", "contiguous", "to_dtype", "copy_as"]),
    ("attention", ["attention", "softmax"]),
]
PAGE_FAULT = ("page", "clear_", "charge", "folio", "lruvec", "mm_fault", "alloc_pages")


def samples(path):
    """Yields each sample's frames (symbol names), leaf first."""
    cur = None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                if cur is not None:
                    yield cur
                cur = None
            elif not line.startswith("\t") and not line.startswith("        "):
                cur = []  # a sample header (tid)
            elif cur is not None:
                parts = line.strip().split(" ", 1)
                cur.append(parts[1] if len(parts) > 1 else "")
    if cur:
        yield cur


# Inlined frames print bare ("fill_row (inlined)"): these names are ours wherever they
# appear, so they count without the crate prefix (else the sample falls through to the
# enclosing conv closure and is charged to the GEMM).
BARE = ("fill_cols", "fill_row", "fill_segment", "source_row", "scale_row")


def kind_of(stack):
    for frame in stack:
        if "headroom" not in frame and "sgemm" not in frame:
            if not any(frame.startswith(b) for b in BARE):
                continue
        for name, patterns in RULES:
            if any(p in frame for p in patterns):
                return name
    # gemm crate micro-kernels whose unwinding stopped short of our frames
    if stack and stack[0].startswith("gemm_"):
        return "gemm"
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("script", help="output of perf script -F tid,ip,sym")
    ap.add_argument("--hz", type=float, default=200.0, help="the -F of perf record")
    ap.add_argument("--other", action="store_true", help="list the unclassified frames")
    args = ap.parse_args()
    count, faults, other = collections.Counter(), collections.Counter(), collections.Counter()
    n = 0
    for stack in samples(args.script):
        n += 1
        kind = kind_of(stack)
        count[kind] += 1
        if stack and any(k in stack[0] for k in PAGE_FAULT):
            faults[kind] += 1
        if kind == "other":
            other[next((f for f in stack if "headroom" in f), stack[0] if stack else "?")[:120]] += 1
    print(f"{n} samples at {args.hz:g} Hz = {n / args.hz:.1f} CPU-s")
    print(f"{'share':>7} {'CPU-s':>8}  {'op kind':30} page faults")
    for kind, v in count.most_common():
        print(f"{100 * v / n:6.2f}% {v / args.hz:8.2f}  {kind:30} {100 * faults[kind] / v:3.0f} %")
    if args.other:
        for frame, v in other.most_common(15):
            print(f"  other {v:6}  {frame}")


if __name__ == "__main__":
    main()
