"""Guard on the pooling kernels' machine code: every thread must issue all its window loads
before it consumes any (see the header of csrc/include/dsv4/compress_kernels.cuh).

  python scripts/check_load_batching.py CUOBJDUMP LIBRARY_OR_CUBIN

Disassembles the sm_90 code of the c4 / c128 pooling kernels whose state and input share a
dtype and checks their streaming loads (LDG.E.EF: window rows and the cr 128 decode copy row,
the only loads issued with the evict-first hint; the cr 4 decode copy row is stored before the
window is read and uses plain loads): no destination register is loaded twice (a
reload means a row was consumed before the next row's load went out) and all of them lie
within MAX_SPAN instructions. Under register pressure the compiler silently serialises the
loads, which made small decode steps 2x slower once; this makes that a CI failure. Mixed-dtype
instances load their two sources in separate passes by design and are not checked.
"""
import re
import subprocess
import sys

MAX_SPAN = 200  # instructions between the first and the last window load (seen: 8 to 133)


def functions(cuobjdump: str, path: str):
    sass = subprocess.run([cuobjdump, "-sass", path], check=True, capture_output=True,
                          text=True).stdout
    for block in re.split(r"\n\s+Function : ", sass)[1:]:
        name = block.split("\n", 1)[0].strip()
        ins = [line for line in block.split("\n") if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
        yield name, ins


def demangle(name: str) -> str:
    try:
        return subprocess.run(["c++filt", name], check=True, capture_output=True,
                              text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return name


def main() -> int:
    cuobjdump, path = sys.argv[1], sys.argv[2]
    checked, bad = 0, []
    for name, ins in functions(cuobjdump, path):
        if "c4_kernel" not in name and "c128_kernel" not in name:
            continue
        # Mangled template arguments: I <state> <input> ..., f = float, t = unsigned short.
        m = re.search(r"c(?:4|128)_kernelI([ft])([ft])", name)
        if not m or m.group(1) != m.group(2):
            continue  # mixed dtypes: two passes by design
        pretty = demangle(name)
        loads = [(i, re.search(r"LDG\S*\s+(R\d+)", line).group(1))
                 for i, line in enumerate(ins) if "LDG.E.EF" in line]
        if not loads:
            bad.append(f"{pretty}: no streaming window loads found")
            continue
        checked += 1
        dsts = [d for _, d in loads]
        span = loads[-1][0] - loads[0][0]
        if len(set(dsts)) != len(dsts) or span > MAX_SPAN:
            bad.append(f"{pretty}: {len(loads)} window loads over {span} instructions, "
                       f"{len(dsts) - len(set(dsts))} reloaded registers")
    if checked == 0:
        bad.append("no pooling kernel found in the machine code")
    for line in bad:
        print("check_load_batching: SERIALISED " + line)
    if not bad:
        print(f"check_load_batching: {checked} pooling kernels issue their window loads together")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
