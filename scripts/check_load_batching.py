"""Guard on the pooling kernels' machine code: every thread must issue all its window loads
before it consumes any (see the header of csrc/include/dsv4/compress/window_rows.cuh).

  python scripts/check_load_batching.py CUOBJDUMP LIBRARY_OR_CUBIN

Disassembles the sm_90 code of the c4 / c128 pooling kernels (and compress_and_store's c4
kernels, fused/c4_decode_store.cuh and c4_prefill_store.cuh) whose state and input share a dtype, and of the
cr 128 decode kernels of any dtype pair, and checks their streaming loads
(LDG.E.EF: window rows and the cr 128 decode copy row, the only loads issued with the
evict-first hint; the cr 4 decode copy row is stored before the window is read and uses plain
loads), per copy of the pooling code (a kernel may hold several): no destination register is
loaded again after a use (a reload means a row was consumed before the next row's load went
out) and all of them lie within MAX_SPAN instructions. The ape rows (plain loads) must go out
in the same round, before the first use of a loaded value. Under register pressure the
compiler silently serialises the loads (small decode steps then run twice as long), or places a
conversion ahead of the ape loads (one more round trip per mixed-dtype cr 128 decode); this
makes both a CI failure. The other mixed-dtype instances load their two sources
in separate passes by design and are not checked.

The store kernels (compress_norm_rope_store_kernel) get the same guard in another form: after
the grid-dependency wait (ACQBULK) the kernel issues its plan record, rope pair, norm weight and
kv loads as one round (store/store_kernel.cuh; load_bits in store/memory_access.cuh). A
conversion or test of one loaded value placed among them makes the thread wait for that load
before it issues the rest: one more round trip per decode step. The check follows the code
from the wait (falling through conditional branches, taking unconditional ones) and finds the
first instruction that waits on the scoreboard of a load issued after the wait;
3 + 2 * (head_dim / 128) loads (record, out_loc entry, rope pair, weights, row; a split V4.1
row's lane group: one chunk's weights) must be out by then. The scalar twins of the vector
loads (an unaligned tensor's path, predicated on the negation of a vector load's predicate) do
not count.
"""
import re
import subprocess
import sys

MAX_SPAN = 200  # instructions between the first and the last window load (seen: 8 to 133)
MIN_LOADS = 16  # window loads of one copy of the pooling code (8 rows x kv, score)
APE_LOADS = 8  # ape rows a thread loads in the same round as its window rows


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


def round_from(ins, start, loads_may_wait=False):
    """(address, opcode) of the loads issued from decoded instruction `start` on, following the
    code (falling through conditional branches, taking unconditional ones), before the first
    instruction that waits on the scoreboard of one of them; or None and an error. The scalar
    twins of vector loads (an unaligned tensor's path, predicated on the negation of a vector
    load's predicate) are left out. loads_may_wait: a load that waits (to write a register an
    earlier load of the round writes) does not end the round, only a use of a loaded value."""
    at = {a: i for i, (a, _, _, _) in enumerate(ins)}
    vec = re.compile(r"LDG\.E\.(64|128)\b")
    vec_preds = {m.group(1) for _, t, _, _ in ins
                 for m in [re.match(r"@(P\d) LDG\.E\.(?:64|128)\b", t)] if m}
    pending, issued, i, steps = {}, [], start, 0
    while i < len(ins) and steps < 4000:
        steps += 1
        addr, text, wb, wait = ins[i]
        m = re.match(r"(?:@(!?)(P\d) )?(LDG\S*)", text)
        if any(wait >> k & 1 and pending.get(k) for k in range(6)) and not (loads_may_wait and m):
            return issued, None
        if m and wb is not None:
            scalar_twin = m.group(1) == "!" and m.group(2) in vec_preds and not vec.match(m.group(3))
            if not scalar_twin:
                pending[wb] = True
                issued.append((addr, m.group(3)))
        if text.startswith("BRA "):
            target = int(text.split()[1], 16)
            if target not in at:
                return None, f"branch to unknown address {target:#x}"
            i = at[target]
            continue
        if text.startswith("EXIT") or text.startswith("RET"):
            break
        i += 1
    return None, "no wait on a load issued in the round"


def store_round(lines):
    """Loads issued after the wait before the first wait on one of them, or an error."""
    ins = decoded(lines)
    start = next((i for i, x in enumerate(ins) if x[1] == "ACQBULK"), None)
    if start is None:
        return None, "no grid-dependency wait (ACQBULK) found"
    issued, err = round_from(ins, start + 1)
    return (None, err) if err else (len(issued), None)


def block_start(ins, i):
    """Decoded index of the first instruction of the basic block holding instruction i."""
    targets = {int(t.split()[-1], 16) for _, t, _, _ in ins
               if re.match(r"(@!?P\d )?BRA ", t) and re.search(r"0x[0-9a-f]+$", t)}
    while i > 0 and ins[i][0] not in targets and not re.match(r"(@!?P\d )?BRA ", ins[i - 1][1]):
        i -= 1
    return i


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
        m = re.search(r"compress_norm_rope_store_kernelILi(\d)E[a-z]Li(\d)E", name)
        if m:
            # Formats 0 (fp8_ds_mla), 1 (bf16) and 4.. (fp8_ds_mla rows in a V4.1 layout,
            # store_layout_format) have head_dim 512, the indexers (2, 3) 128. A split row's
            # lane group (kRowGroups 4) loads one chunk's weights, the whole row.
            chunks = 1 if int(m.group(1)) in (2, 3) else 4
            need = 3 + chunks + (1 if int(m.group(2)) > 1 else chunks)
            issued, err = store_round(lines)
            stores += 1
            if err or issued < need:
                bad.append(f"{demangle(name)}: {err or f'only {issued} of {need} loads'}"
                           " issued after the wait before the first use of one")
            continue
        # The pooling kernels (include/dsv4/compress/c4.cuh, c128_prefill.cuh, c128_decode.cuh;
        # fused/c4_decode_store.cuh and c4_prefill_store.cuh pool with c4.cuh's code).
        # Mangled template arguments: I <state> <input> ..., f = float, t = unsigned short.
        m = re.search(r"(c4|c128_prefill|c128_decode|c4_decode_store|c4_prefill_store)"
                      r"_kernelI([ft])([ft])", name)
        if not m or (m.group(2) != m.group(3) and m.group(1) != "c128_decode"):
            continue  # mixed dtypes outside the cr 128 decode: two passes by design
        pretty = demangle(name)
        # (index, destination, predicate) of each streaming load
        loads = [(i, mm.group(2), mm.group(1) or "")
                 for i, line in enumerate(ins) if "LDG.E.EF" in line
                 for mm in [re.search(r"(@!?P\d )?LDG\S*\s+(R\d+)", line)]]
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
        code = decoded(lines)
        index_of = {a: i for i, (a, _, _, _) in enumerate(code)}
        addr_of = [int(re.match(r"\s+/\*([0-9a-f]{4})\*/", line).group(1), 16) for line in ins]
        for group in groups:
            # A register loaded again after an instruction used it is a reload. Two predicated
            # loads into one register with no use between are the two sources of one row
            # (load_rows_either), not a reload.
            reloads, last = 0, {}
            for i, d, pred in group:
                if d in last:
                    j, jpred = last[d]
                    used = any(re.search(rf"\b{d}\b", ins[k].split(";")[0].split(None, 2)[-1])
                               for k in range(j + 1, i))
                    reloads += used or not (pred and jpred)
                last[d] = (i, pred)
            span = group[-1][0] - group[0][0]
            if reloads or span > MAX_SPAN or len(group) < MIN_LOADS:
                bad.append(f"{pretty}: {len(group)} window loads over {span} instructions, "
                           f"{reloads} reloaded registers")
                continue
            # The ape rows (plain loads) go out in the same round, from the start of the basic
            # block of the first window load to the first use of a loaded value: a use of a
            # window row ahead of them costs one more round trip (e.g. bf16 state rows unpacked
            # ahead of the branch on the ape's type). The second source of a load_rows_either
            # row waits for the first (one register), which is not a use; it delays the ape
            # loads of the fp32-state / bf16-input decode instance until its state rows arrive,
            # which costs little against fp32 / fp32.
            first = index_of[addr_of[group[0][0]]]
            issued, err = round_from(code, block_start(code, first), loads_may_wait=True)
            window = {addr_of[i] for i, _, _ in group}
            ape = [a for a, op in issued or [] if not op.startswith("LDG.E.EF")]
            if err or not window <= {a for a, _ in issued} or len(ape) < APE_LOADS:
                got = err or f"{len(ape)} ape loads, {len(window & {a for a, _ in issued})} window loads"
                bad.append(f"{pretty}: {got} issued before the first use of one "
                           f"(need {APE_LOADS} and {len(window)})")
    if checked == 0:
        bad.append("no pooling kernel found in the machine code")
    if stores == 0:
        bad.append("no store kernel found in the machine code")
    for line in bad:
        print("check_load_batching: SERIALISED " + line)
    if not bad:
        print(f"check_load_batching: {checked} pooling kernels issue their window and ape loads"
              " together,"
              f" {stores} store kernels their inputs' loads")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
