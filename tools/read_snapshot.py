#!/usr/bin/env python3
"""Reads a headroom session snapshot (`.hrsnap`) with the standard library only and
checks its checksum: the file is safetensors, so `safetensors.safe_open` reads its
tensors too; this shows the layout (docs/design/snapshots.md).

    python3 tools/read_snapshot.py snaps/chunk-1.hrsnap

prints the format, where the session stands, what it ran on, its tensors by part and
whether the checksum holds (exit 1 when it does not).
"""
import hashlib
import json
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    meta = header.pop("__metadata__")
    tensors = {
        name: (t["dtype"], t["shape"], body[t["data_offsets"][0] : t["data_offsets"][1]])
        for name, t in header.items()
    }
    return meta, tensors


# safetensors' dtype names → headroom's (the checksum hashes headroom's).
DTYPES = {"F32": "f32", "BF16": "bf16", "F16": "f16", "U8": "u8", "I64": "i64",
          "F8_E4M3": "f8e4m3", "F8_E5M2": "f8e5m2", "I8": "i8"}


def checksum(meta, tensors):
    h = hashlib.sha256()
    h.update(meta["meta"].encode() + b"\0" + meta["fields"].encode() + b"\0")
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        h.update(name.encode() + b"\0" + DTYPES[dtype].encode() + b"\0")
        for d in shape:
            h.update(struct.pack("<Q", d))
        h.update(raw)
    return "sha256:" + h.hexdigest()


def main():
    meta, tensors = read(sys.argv[1])
    info = json.loads(meta["meta"])
    fields = json.loads(meta["fields"])
    print(f"{meta['format']} version {meta['version']}")
    print("progress:", info["progress"])
    print("identity:", info["identity"])
    parts = {}
    for name, (_, _, raw) in tensors.items():
        part = name.split(".")[0]
        parts[part] = parts.get(part, 0) + len(raw)
    for part, size in sorted(parts.items()):
        print(f"  {part:<13} {size:>12} B")
    print(f"{len(tensors)} tensors, {len(fields)} fields; next block {fields['session.next_block']}")
    ok = checksum(meta, tensors) == meta["checksum"]
    print("checksum", "holds" if ok else "DOES NOT HOLD")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
