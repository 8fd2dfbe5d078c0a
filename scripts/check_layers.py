#!/usr/bin/env python3
"""The layers of src/, enforced: every folder of src/ has a layer (the list under "Layers, lowest
first" in the README's Layout section, the one place it is written), and

  1. a file includes headers of its own folder, of folders of its layer and of lower layers only
     (`#include "folder/..."`); never of a higher one;
  2. two folders never include each other, directly or around a longer cycle;
  3. tests (`*_test.cpp`, `*_test_util.h`) follow the same rules, except the upward includes
     listed in scripts/layer_exceptions.txt: tests that still build a whole Trainer where a
     small fixture should serve. The list only shrinks: an entry that no longer occurs fails too,
     so whoever fixes one removes it. Product code has no exceptions.

    check_layers.py [--root DIR]     exit 0: clean; 1: violations (each named); 2: bad input
    check_layers.py --self-test      the checker against small trees it makes (exit 0: it caught
                                     every planted violation)
"""
import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+)/[^"]+"', re.M)
SOURCE_SUFFIXES = (".h", ".cpp", ".cu", ".cuh")


def is_test(path):
    name = Path(path).name
    return name.endswith("_test.cpp") or name.endswith("_test_util.h")


def read_layers(readme):
    """{folder: layer index} from the README's "Layers, lowest first" list (indented lines of
    comma-separated folders, one layer per line)."""
    lines = Path(readme).read_text(encoding="utf-8").splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith("Layers, lowest first")), None)
    if start is None:
        raise SystemExit(f"check_layers: {readme} has no line starting 'Layers, lowest first'")
    out, index = {}, 0
    first = start + 1  # (the sentence may run over several lines before the list)
    while first < len(lines) and lines[first].strip() and not lines[first].startswith("  "):
        first += 1
    for line in lines[first:]:
        if not line.startswith("  ") or not line.strip():
            break
        for folder in line.split(","):
            folder = folder.strip()
            if folder in out:
                raise SystemExit(f"check_layers: {readme}: '{folder}' is listed twice")
            if folder:
                out[folder] = index
        index += 1
    if not out:
        raise SystemExit(f"check_layers: {readme}: the layer list after 'Layers, lowest first' is empty")
    return out


def read_exceptions(path):
    """{(file, folder)} from lines 'src/a/b_test.cpp folder  # why'."""
    out = set()
    if not Path(path).exists():
        return out
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise SystemExit(f"check_layers: {path}:{n}: expected 'FILE FOLDER', got '{line}'")
        out.add((parts[0], parts[1]))
    return out


def check(root, readme=None, exceptions_file=None):
    root = Path(root)
    layers = read_layers(readme or root / "README.md")
    exceptions = read_exceptions(exceptions_file or root / "scripts" / "layer_exceptions.txt")
    problems = []
    src = root / "src"
    folders = sorted(p.name for p in src.iterdir() if p.is_dir())
    for f in folders:
        if f not in layers:
            problems.append(f"src/{f}/ has no layer: add it to the README's 'Layers, lowest first' list")
    edges = {f: {} for f in folders}  # folder -> {included folder: first product file}
    used_exceptions = set()
    for f in folders:
        for path in sorted((src / f).iterdir()):
            if path.suffix not in SOURCE_SUFFIXES:
                continue
            rel = f"src/{f}/{path.name}"
            included = {m.group(1) for m in INCLUDE.finditer(path.read_text(encoding="utf-8", errors="replace"))}
            for g in sorted(included):
                if g == f or g not in folders:
                    continue
                if g not in layers or f not in layers:
                    continue
                if not is_test(rel):
                    edges[f].setdefault(g, rel)
                if layers[g] > layers[f]:
                    if is_test(rel) and (rel, g) in exceptions:
                        used_exceptions.add((rel, g))
                        continue
                    problems.append(f"{rel} includes {g}/, a layer above {f}/ "
                                    f"({g}: layer {layers[g]}, {f}: layer {layers[f]})")
    for rel, g in sorted(exceptions - used_exceptions):
        if not is_test(rel):
            problems.append(f"scripts/layer_exceptions.txt lists {rel}, which is not a test: product code has no exceptions")
        else:
            problems.append(f"scripts/layer_exceptions.txt lists {rel} -> {g}/, which no longer occurs: remove the line")
    # Cycles between folders (product code): depth-first search for a back edge.
    state, stack = {}, []

    def visit(f):
        state[f] = 1
        stack.append(f)
        for g in sorted(edges[f]):
            if state.get(g) == 1:
                cycle = stack[stack.index(g):] + [g]
                via = ", ".join(f"{a} -> {b} ({edges[a][b]})" for a, b in zip(cycle, cycle[1:]))
                problems.append(f"folders include each other: {via}")
            elif g not in state:
                visit(g)
        stack.pop()
        state[f] = 2

    for f in folders:
        if f not in state:
            visit(f)
    return problems


def self_test():
    def tree(files, layers):
        d = Path(tempfile.mkdtemp(prefix="vidit_layers_"))
        (d / "README.md").write_text("Layers, lowest first:\n" + "".join(f"  {l}\n" for l in layers) + "\n")
        (d / "scripts").mkdir()
        for name, text in files.items():
            p = d / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        return d

    cases = [
        ("clean", {"src/core/a.h": "", "src/model/b.cpp": '#include "core/a.h"\n'}, ["core", "model"], []),
        ("upward", {"src/core/a.h": '#include "model/b.h"\n', "src/model/b.h": ""}, ["core", "model"],
         ["src/core/a.h includes model/"]),
        ("mutual", {"src/a/x.h": '#include "b/y.h"\n', "src/b/y.h": '#include "a/x.h"\n'}, ["a, b"],
         ["folders include each other"]),
        ("no layer", {"src/core/a.h": "", "src/extra/b.h": ""}, ["core"], ["src/extra/ has no layer"]),
        ("test upward", {"src/core/a_test.cpp": '#include "model/b.h"\n', "src/model/b.h": ""}, ["core", "model"],
         ["src/core/a_test.cpp includes model/"]),
    ]
    failed = 0
    for name, files, layers, want in cases:
        got = check(tree(files, layers))
        ok = len(got) == len(want) and all(any(w in g for g in got) for w in want)
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {got}")
        failed += not ok
    # An exception lets a test through, and a stale one is reported.
    d = tree({"src/core/a_test.cpp": '#include "model/b.h"\n', "src/model/b.h": ""}, ["core", "model"])
    (d / "scripts" / "layer_exceptions.txt").write_text("src/core/a_test.cpp model  # builds a model\n")
    got = check(d)
    print(f"{'ok  ' if not got else 'FAIL'} exception: {got}")
    failed += bool(got)
    (d / "src" / "core" / "a_test.cpp").write_text("")
    got = check(d)
    ok = len(got) == 1 and "no longer occurs" in got[0]
    print(f"{'ok  ' if ok else 'FAIL'} stale exception: {got}")
    failed += not ok
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    problems = check(args.root)
    for p in problems:
        print("layers:", p)
    if problems:
        print(f"check_layers: {len(problems)} violation(s); the layers are in the README's Layout section")
        return 1
    layers = read_layers(Path(args.root) / "README.md")
    print(f"check_layers: {len(layers)} folders in {max(layers.values()) + 1} layers, no upward include, no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
