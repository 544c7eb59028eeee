#!/usr/bin/env python3
"""Lists the import cycles among lethe's source files (dependencies point one way).

Each file under src/ is a module (src/a/b.rs and src/a/b/mod.rs are `a::b`; main.rs and
cli.rs form the binary, which sits above the library). An edge A -> B is drawn when A
names an item of B: a `use` line or an inline path through `crate::`, `super::`, `self::`,
`lethe::` or a child module's name. Unit tests (`#[cfg(test)]` to the end of the file) are left out. The
strongly connected components of more than one file are the cycles. Exit status 1 when
there is one.

Usage: scripts/module-cycles.py [--edges] [--layers]
"""
import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def module_of(path: Path) -> tuple:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "mod":
        parts.pop()
    if parts in (["lib"], ["main"]):
        return ()
    return tuple(parts)


def expand_use(body: str) -> list:
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]."""
    body = body.strip()
    depth, split_at = 0, None
    for i, ch in enumerate(body):
        if ch == "{":
            if depth == 0 and split_at is None:
                split_at = i
            depth += 1
        elif ch == "}":
            depth -= 1
    if split_at is None:
        return [body]
    prefix, inner = body[:split_at], body[split_at + 1 : body.rindex("}")]
    items, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            items.append(inner[start:i])
            start = i + 1
    items.append(inner[start:])
    return [p for item in items if item.strip() for p in expand_use(prefix + item.strip())]


def resolve(path: str, here: tuple, modules: set, binary: bool) -> tuple:
    parts = [p.strip() for p in path.split(" as ")[0].split("::") if p.strip()]
    if not parts:
        return None
    head, rest = parts[0], parts[1:]
    if head == "crate" or (head == "lethe" and binary):
        base = () if not binary or head == "lethe" else None
        if base is None:  # crate:: inside the binary means main.rs's own modules
            base = ("<bin>",)
    elif head == "super":
        base = here[:-1]
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    elif head == "self":
        base = here
    elif not binary and here + (head,) in modules:  # a child module, named relatively
        base, rest = here, parts
    else:
        return None
    target = base
    for p in rest:
        if base and base[0] == "<bin>":
            return None
        if target + (p,) in modules:
            target = target + (p,)
        else:
            break
    return target


def scan(path: Path, modules: set) -> set:
    here = module_of(path)
    binary = path.name in ("main.rs", "cli.rs")
    text = path.read_text()
    text = text.split("#[cfg(test)]")[0]
    text = re.sub(r"//[^\n]*", "", text)
    targets = set()
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        for p in expand_use(m.group(1)):
            targets.add(resolve(p, here, modules, binary))
    for m in re.finditer(r"(?<![\w:])(\w+(?:::\w+)+)", text):
        targets.add(resolve(m.group(1), here, modules, binary))
    me = ("<bin>",) if binary else here
    return {t for t in targets if t is not None and t != me and t != ("<bin>",) and t != ()}


def sccs(graph: dict) -> list:
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    files = sorted(SRC.rglob("*.rs"))
    modules = {module_of(f) for f in files if f.name not in ("main.rs", "cli.rs")}
    graph = {}
    for f in files:
        me = ("<bin>",) if f.name in ("main.rs", "cli.rs") else module_of(f)
        if me == ():
            continue
        graph.setdefault(me, set()).update(scan(f, modules))
    name = lambda m: "::".join(m)
    if "--edges" in sys.argv:
        for m in sorted(graph):
            print(f"{name(m)} -> {', '.join(sorted(name(t) for t in graph[m]))}")
    cycles = [sorted(c) for c in sccs(graph) if len(c) > 1]
    for c in cycles:
        print(f"cycle of {len(c)} files: {', '.join(name(m) for m in c)}")
    if not cycles:
        print(f"no import cycle among {len(graph)} source files")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
