"""Guard on the pooling kernels' machine code: every thread must issue all its window loads
before it consumes any (see the header of csrc/include/dsv4/compress_kernels.cuh).

  python scripts/check_load_batching.py CUOBJDUMP LIBRARY_OR_CUBIN

Disassembles the sm_90 code of the c4 / c128 pooling kernels whose state and input share a
dtype and checks their streaming loads (LDG.E.EF: window rows and the cr 128 decode copy row,
the only loads issued with the evict-first hint; the cr 4 decode copy row is stored before the
window is read and uses plain loads): no destination register is loaded twice (a
reload means a row was consumed before the next row's load went out) and all of them lie
within MAX_SPAN instructions (per copy of the pooling code where a kernel holds several). Under register pressure the compiler silently serialises the
loads, which made small decode steps 2x slower once; this makes that a CI failure. Mixed-dtype
instances load their two sources in separate passes by design and are not checked.

The store kernels (compress_norm_rope_store_kernel) get the same guard in another form: after
the grid-dependency wait (ACQBULK) the kernel issues its plan record, rope pair, norm weight and
kv loads as one round (store_kernels.cuh, load_bits). A conversion or test of one loaded value
placed among them makes the thread wait for that load before it issues the rest: one more round
trip per decode step. The check follows the code from the wait (falling through conditional
branches, taking unconditional ones) and finds the first instruction that waits on the
scoreboard of a load issued after the wait; 3 + 2 * (head_dim / 128) loads (record, out_loc
entry, rope pair, weights, row) must be out by then. The scalar twins of the vector loads (an
unaligned tensor's path, predicated on the negation of a vector load's predicate) do not count.
"""
import re
import subprocess
import sys

MAX_SPAN = 200  # instructions between the first and the last window load (seen: 8 to 133)
MIN_LOADS = 16  # window loads of one copy of the pooling code (8 rows x kv, score)


def functions(cuobjdump: str, path: str):
    sass = subprocess.run([cuobjdump, "-sass", path], check=True, capture_output=True,
                          text=True).stdout
    for block in re.split(r"\n\s+Function : ", sass)[1:]:
        name = block.split("\n", 1)[0].strip()
        lines = block.split("\n")
        ins = [line for line in lines if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
        yield name, ins, lines


def decoded(lines):
    """(address, instruction text, write scoreboard or None, wait mask) per instruction. The
    control bits of sm_90 SASS sit in bits 105-125 of the 128-bit word (the second hex word
    cuobjdump prints): write barrier bits 110-112 (7 = none), wait mask bits 116-121."""
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"\s+/\*([0-9a-f]{4})\*/\s+(.*?)\s*/\* 0x[0-9a-f]+ \*/", line)
        if not m or i + 1 >= len(lines):
            continue
        hi = re.search(r"/\* (0x[0-9a-f]+) \*/", lines[i + 1])
        ctrl = int(hi.group(1), 16) >> 41
        wb = (ctrl >> 5) & 7
        out.append((int(m.group(1), 16), re.sub(r"\s+", " ", m.group(2)).rstrip(" ;"),
                    None if wb == 7 else wb, (ctrl >> 11) & 0x3F))
    return out


def store_round(lines):
    """Loads issued after the wait before the first wait on one of them, or an error."""
    ins = decoded(lines)
    at = {a: i for i, (a, _, _, _) in enumerate(ins)}
    start = next((i for i, x in enumerate(ins) if x[1] == "ACQBULK"), None)
    if start is None:
        return None, "no grid-dependency wait (ACQBULK) found"
    vec = re.compile(r"LDG\.E\.(64|128)\b")
    vec_preds = {m.group(1) for _, t, _, _ in ins
                 for m in [re.match(r"@(P\d) LDG\.E\.(?:64|128)\b", t)] if m}
    pending, issued, i, steps = {}, 0, start + 1, 0
    while i < len(ins) and steps < 4000:
        steps += 1
        _, text, wb, wait = ins[i]
        hit = [k for k in range(6) if wait >> k & 1 and pending.get(k)]
        if hit:
            return issued, None
        m = re.match(r"(?:@(!?)(P\d) )?(LDG\S*)", text)
        if m and wb is not None:
            scalar_twin = m.group(1) == "!" and m.group(2) in vec_preds and not vec.match(m.group(3))
            if not scalar_twin:
                pending[wb] = True
                issued += 1
        if text.startswith("BRA "):
            target = int(text.split()[1], 16)
            if target not in at:
                return None, f"branch to unknown address {target:#x}"
            i = at[target]
            continue
        if text.startswith("EXIT") or text.startswith("RET"):
            break
        i += 1
    return None, "no wait on a load issued after the grid-dependency wait"


def demangle(name: str) -> str:
    try:
        return subprocess.run(["c++filt", name], check=True, capture_output=True,
                              text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return name


def main() -> int:
    cuobjdump, path = sys.argv[1], sys.argv[2]
    checked, bad = 0, []
    stores = 0
    for name, ins, lines in functions(cuobjdump, path):
        m = re.search(r"compress_norm_rope_store_kernelILi(\d)E", name)
        if m:
            # Formats 0 (fp8_ds_mla) and 1 (bf16) have head_dim 512, the indexers 128.
            need = 3 + 2 * (4 if int(m.group(1)) < 2 else 1)
            issued, err = store_round(lines)
            stores += 1
            if err or issued < need:
                bad.append(f"{demangle(name)}: {err or f'only {issued} of {need} loads'}"
                           " issued after the wait before the first use of one")
            continue
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
        # A kernel may hold its pooling code more than once (the c128 decode kernel: one request
        # per block, and the loop of a block that pools several): one group of loads per copy,
        # the groups more than MAX_SPAN instructions apart.
        groups = [[loads[0]]]
        for prev, cur in zip(loads, loads[1:]):
            if cur[0] - prev[0] > MAX_SPAN:
                groups.append([])
            groups[-1].append(cur)
        for group in groups:
            dsts = [d for _, d in group]
            span = group[-1][0] - group[0][0]
            if len(set(dsts)) != len(dsts) or span > MAX_SPAN or len(group) < MIN_LOADS:
                bad.append(f"{pretty}: {len(group)} window loads over {span} instructions, "
                           f"{len(dsts) - len(set(dsts))} reloaded registers")
    if checked == 0:
        bad.append("no pooling kernel found in the machine code")
    if stores == 0:
        bad.append("no store kernel found in the machine code")
    for line in bad:
        print("check_load_batching: SERIALISED " + line)
    if not bad:
        print(f"check_load_batching: {checked} pooling kernels issue their window loads together,"
              f" {stores} store kernels their inputs' loads")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
