#!/usr/bin/env python3
"""Static report on the machine code (SASS) of attn's CUDA kernels: what a tile costs in instructions,
and whether its common path touches local memory. Run by scripts/sass-report, which compiles the
kernels to a cubin and disassembles it with cuobjdump; needs no GPU.

usage: sass.py KERNELS.sass PTXAS.log
       sass.py KERNELS.sass --blocks NAME   the basic blocks of a kernel's tile loop (from the loop head to
                                            its last mma block), one a line: index, address, instructions,
                                            exp2 count, the commonest opcodes and the last instruction
                                            (its branch), to trace a tile's path by hand (docs/cuda.md)

The hot blocks of a kernel are its basic blocks that hold a tensor-core mma (HMMA) or four or more
softmax exponentials (MUFU.EX2): S = Q K^T, the softmax and O += P V of every tile. (The rare paths --
masked tiles, softcap, non-finite values -- live in other blocks, with one exp2 each at most; the tile
loads and barriers of the common path are not counted either, so the instruction count is a lower bound
on a tile's.) Local memory (LDL/STL) in a hot block means registers spilled, or an array the compiler
could not keep in registers, on every tile; the report exits 1 then.
"""
import collections
import re
import sys


def parse_functions(sass):
    """{mangled name: [(address, opcode, text)]} from cuobjdump -sass output."""
    out = {}
    for chunk in re.split(r"\n\s*Function : ", sass)[1:]:
        name = chunk.split(None, 1)[0]
        ins = []
        for line in chunk.split("\n"):
            m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
            if not m:
                continue
            text = m.group(2)
            if text.startswith("@"):
                text = text.split(None, 1)[1]
            ins.append((int(m.group(1), 16), text.split()[0], text))
        out[name] = ins
    return out


def basic_blocks(ins):
    """Split at branch targets and after control transfers."""
    targets = set()
    for _, op, text in ins:
        if op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", text)
            if m:
                targets.add(int(m.group(1), 16))
    blocks, cur = [], []
    for x in ins:
        if x[0] in targets and cur:
            blocks.append(cur)
            cur = []
        cur.append(x)
        if x[1].startswith(("BRA", "EXIT", "RET", "CALL", "BSYNC")):
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    return blocks


def hot_counts(ins):
    c = collections.Counter()
    for block in basic_blocks(ins):
        ops = [op for _, op, _ in block]
        exps = sum(op.startswith("MUFU.EX2") for op in ops)
        if not any(op.startswith("HMMA") for op in ops) and exps < 4:
            continue
        c["instr"] += len(ops)
        for op in ops:
            for key in ("HMMA", "LDSM", "MUFU.EX2", "LDL", "STL"):
                if op.startswith(key):
                    c[key] += 1
    return c


def ptxas_info(log):
    """{mangled name: (registers, stack bytes, spill store bytes, spill load bytes)} from ptxas -v."""
    info, name, frame = {}, None, None
    for line in log.split("\n"):
        m = re.search(r"Compiling entry function '(\S+)' for", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            frame = tuple(int(g) for g in m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name and frame:
            info[name] = (int(m.group(1)),) + frame
            name = frame = None
    return info


def short_name(mangled):
    """forward_kernel<Bf16, FwdTraits<128,8,1,64,1>> from the mangled name (enough to tell them apart)."""
    kind = re.search(r"(forward_kernel|decode_kernel|merge_kernel|append_kernel)", mangled)
    dtype = "bf16" if "Bf16" in mangled else "f16" if "F16" in mangled else ""
    traits = re.search(r"(FwdTraits|DecTraits)I((?:Li\d+E)+)", mangled)
    args = ",".join(re.findall(r"Li(\d+)E", traits.group(2))) if traits else ""
    if not traits:
        args = ",".join(re.findall(r"Li(\d+)E", mangled))
    return f"{kind.group(1) if kind else mangled[:40]}<{dtype}{',' if dtype and args else ''}{args}>"


def print_tile_blocks(ins):
    """From the loop head (where the last mma block branches back to) to the last mma block."""
    blocks = basic_blocks(ins)
    mma = [i for i, b in enumerate(blocks) if any(op.startswith("HMMA") for _, op, _ in b)]
    if not mma:
        return
    first = mma[0]
    back = re.search(r"BRA 0x([0-9a-f]+)", blocks[mma[-1]][-1][2])
    if back:
        first = min([i for i, b in enumerate(blocks) if b[0][0] == int(back.group(1), 16)] + [first])
    for i in range(first, mma[-1] + 1):
        ops = [op for _, op, _ in blocks[i]]
        common = collections.Counter(op.split(".")[0] for op in ops).most_common(5)
        exps = sum(op.startswith("MUFU.EX2") for op in ops)
        print(f"{i:5d} {blocks[i][0][0]:#07x} {len(ops):4d} EX2={exps:<3d} "
              f"{' '.join(f'{k}:{n}' for k, n in common):60s} | {blocks[i][-1][2][:60]}")


def main():
    if len(sys.argv) == 4 and sys.argv[2] == "--blocks":
        funcs = parse_functions(open(sys.argv[1]).read())
        names = sorted(n for n in funcs if sys.argv[3] in short_name(n))
        if not names:
            print(f"sass.py: no kernel named like {sys.argv[3]}", file=sys.stderr)
            return 2
        print(short_name(names[0]))
        print_tile_blocks(funcs[names[0]])
        return 0
    sass, log = open(sys.argv[1]).read(), open(sys.argv[2]).read()
    funcs, regs = parse_functions(sass), ptxas_info(log)
    print(f"{'kernel':44s} {'regs':>4s} {'stack':>5s} {'spill':>9s} | hot blocks: {'instr':>5s} {'HMMA':>5s} "
          f"{'LDSM':>5s} {'EX2':>4s} {'instr/HMMA':>10s} {'local':>5s}")
    bad = []
    for name in sorted(funcs, key=short_name):
        c = hot_counts(funcs[name])
        r = regs.get(name, (0, 0, 0, 0))
        per = f"{c['instr'] / c['HMMA']:.1f}" if c["HMMA"] else "-"
        local = c["LDL"] + c["STL"]
        print(f"{short_name(name):44s} {r[0]:4d} {r[1]:5d} {r[2]:4d}/{r[3]:<4d} |             {c['instr']:5d} "
              f"{c['HMMA']:5d} {c['LDSM']:5d} {c['MUFU.EX2']:4d} {per:>10s} {local:5d}")
        if local:
            bad.append(short_name(name))
    if bad:
        print("local memory in the hot blocks of: " + ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
