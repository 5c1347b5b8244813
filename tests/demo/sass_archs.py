#!/usr/bin/env python3
"""Checks which GPU code an executable carries against the CUDA architectures it was built for.

    sass_archs.py BINARY ARCHS

ARCHS is CMake's CMAKE_CUDA_ARCHITECTURES ("80-real;89-real;90a-real"; "90a" means SASS and
PTX, "90a-virtual" PTX only), or "none": then the binary must hold no GPU code and must not
link the CUDA runtime or cuBLASLt (a build with no CUDA compilation at all). "native", "all"
and "all-major" name no fixed list: exit 77 (skipped).

The GPU code is read from the ELF's .nv_fatbin section, whose containers list one entry per
cubin (SASS) or PTX with its architecture, as `cuobjdump --list-elf/--list-ptx` would show
them; cuobjdump is not part of every CUDA install, so the few header fields are read here.
"""
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2
ARCH_SPECIFIC = 0x100000  # entry flag of the "a" variants (sm_90a)


def sections(data):
    """{name: bytes} of a 64-bit little-endian ELF file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = heads[shstrndx]
    names = data[strtab[4]:strtab[4] + strtab[5]]
    out = {}
    for name_off, kind, _flags, _addr, off, size in heads:
        name = names[name_off:names.index(b"\0", name_off)].decode()
        out[name] = data[off:off + size] if kind != 8 else b""  # SHT_NOBITS holds no bytes
    return out


def gpu_code(fatbin):
    """Counts of {"sm_90a": n, "compute_90a": n, ...} in an .nv_fatbin section."""
    found = {}
    pos = 0
    while pos + 16 <= len(fatbin):
        magic, _version, header_size, size = struct.unpack_from("<IHHQ", fatbin, pos)
        if magic != FATBIN_MAGIC:  # containers are padded apart
            pos += 8
            continue
        entry, end = pos + header_size, pos + header_size + size
        while entry + 64 <= end:
            kind, _, entry_size, payload = struct.unpack_from("<HHIQ", fatbin, entry)
            arch, = struct.unpack_from("<I", fatbin, entry + 28)
            flags, = struct.unpack_from("<Q", fatbin, entry + 40)
            if entry_size == 0:
                break
            suffix = "a" if flags & ARCH_SPECIFIC else ""
            prefix = {KIND_ELF: "sm", KIND_PTX: "compute"}.get(kind)
            if prefix:
                name = f"{prefix}_{arch}{suffix}"
                found[name] = found.get(name, 0) + 1
            entry += entry_size + payload
        pos = end
    return found


def expected(archs):
    want = set()
    for a in filter(None, archs.replace(" ", ";").split(";")):
        num, _, mode = a.partition("-")
        if mode in ("", "real"):
            want.add("sm_" + num)
        if mode in ("", "virtual"):
            want.add("compute_" + num)
    return want


def main():
    binary, archs = sys.argv[1], sys.argv[2]
    if archs in ("native", "all", "all-major"):
        print(f"CMAKE_CUDA_ARCHITECTURES={archs}: no fixed list to check against; skipped")
        return 77
    data = open(binary, "rb").read()
    secs = sections(data)
    found = gpu_code(secs.get(".nv_fatbin", b""))
    print(f"{binary}: {', '.join(f'{k} ({v})' for k, v in sorted(found.items())) or 'no GPU code'}; "
          f"built for: {archs}")
    problems = []
    if archs == "none":
        if found or ".nv_fatbin" in secs:
            problems.append("GPU code in a build without CUDA")
        dynstr = secs.get(".dynstr", b"")
        for lib in (b"libcudart.so", b"libcublasLt.so"):
            if lib in dynstr:
                problems.append(f"links {lib.decode()} in a build without CUDA")
    else:
        want = expected(archs)
        if not found:
            problems.append("no GPU code at all")
        if set(found) != want:
            problems.append(f"expected exactly {', '.join(sorted(want))}")
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
