"""What host C++ cannot say of a .cu file, rewritten before g++ sees it, each on the line it was
on (line numbers stay right): shared memory, __device__ variables, and one launcher per kernel.

    __shared__ float tile[16][17], row[16];   a slot of the worker's shared arena each
    extern __shared__ float smem[];           the block's dynamic shared buffer
    __device__ unsigned counter = 0;          an object of its own, between PROT_NONE pages
"""

from __future__ import annotations

import re

# `extern __shared__ float smem[];` -> a pointer into the block's dynamic shared buffer.
_DYN_SHARED = re.compile(
    r"extern\s+__shared__\s+((?:__align__\s*\(\s*\d+\s*\)\s*)?)([A-Za-z_][\w:<>\s]*?)\s+"
    r"([A-Za-z_]\w*)\s*\[\s*\]\s*;"
)

# `__shared__ float tile[16][17], row[16];` -> an id taken the first time the declaration runs
# (one per template instantiation) and a reference to the id's slot in the running worker's
# arena, through an opaque pointer. Why the reference: GCC's hooks skip accesses to a static
# array at a constant index (`tile[0][3]`, a scalar), which would leave them uncounted and
# outside the race check.
_STATIC_SHARED = re.compile(
    r"(?<![\w])__shared__\s+(?P<align>__align__\s*\(\s*\d+\s*\)\s+)?"
    r"(?P<type>(?:(?:const|unsigned|signed|long|short|typename)\s+)*[A-Za-z_][\w:]*"
    r"(?:\s*<[^;<>]*>)?)\s+(?P<decls>[^;{}()]+);"
)
_DECLARATOR = re.compile(
    r"\s*(?:__align__\s*\(\s*(?P<align>\d+)\s*\)\s*)?(?P<name>[A-Za-z_]\w*)\s*"
    r"(?P<dims>(?:\[[^\]]+\]\s*)*)$"
)

# `__device__ T name[dims] = init;` (a variable, not a function: no parenthesis before `;`).
_DEVICE_VAR = re.compile(
    r"(?<![\w])__device__\s+(?P<type>(?:(?:const|volatile|unsigned|signed|long|short)\s+)*"
    r"[A-Za-z_][\w:]*(?:\s*<[^;<>()]*>)?)\s+(?P<name>[A-Za-z_]\w*)\s*"
    r"(?P<dims>(?:\[[^\]\[;()]+\]\s*)*)(?P<init>=[^;]*)?;"
)


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += {"[": 1, "(": 1, "<": 1, "]": -1, ")": -1, ">": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def _static_shared(m: re.Match) -> str:
    align = re.findall(r"\d+", m.group("align") or "")
    out = []
    for decl in _split_top(m.group("decls")):
        d = _DECLARATOR.match(decl)
        if not d:
            return m.group(0)  # not a plain declaration: leave it to the __shared__ macro
        a = d.group("align") or (align[0] if align else "16")
        name, dims, ty = d.group("name"), d.group("dims").strip(), m.group("type")
        i = f"emu_shared_{name}"
        out.append(f"static const int {i} = emu_shared_declare(sizeof({ty}{dims}), alignof({ty}) "
                   f'> {a} ? alignof({ty}) : {a}, "{name}"); {ty} (&{name}){dims} = '
                   f"*emu_launder(reinterpret_cast<{ty}(*){dims}>(emu_shared_at({i})));")
    return " ".join(out)


def _device_var(m: re.Match) -> str:
    ty, name, dims = m.group("type"), m.group("name"), m.group("dims").strip()
    init = (m.group("init") or "").replace("\n", " ")
    keep = "\n" * m.group(0).count("\n")  # line numbers stay right
    i = f"emu_device_init_{name}"
    return (f"static {ty} {i}{dims} {init}; {ty} (&{name}){dims} = *reinterpret_cast<{ty}(*)"
            f'{dims}>(emu_device_object(&{i}, sizeof({i}), alignof({ty}), "{name}"));{keep}')


def rewrite_source(code: str) -> str:
    """What host C++ cannot express, rewritten on one line each (line numbers are kept)."""
    code = _DYN_SHARED.sub(
        lambda m: f"{m.group(2)}* {m.group(3)} = reinterpret_cast<{m.group(2)}*>"
        "(emu_dynamic_shared());",
        code,
    )
    code = _STATIC_SHARED.sub(_static_shared, code)
    return _DEVICE_VAR.sub(_device_var, code)


def launcher_code(expressions: list[str]) -> str:
    """One exported launcher and signature function per kernel (expression)."""
    lines = ["", "// ---- appended by ckptlab.emu: one launcher per kernel ----"]
    for i, expr in enumerate(expressions):
        lines.append(f"EMU_EXPORT EMU_UNCOUNTED void emu_launch_{i}(void** a) "
                     f"{{ emu_invoke(&{expr}, a); }}")
        lines.append(
            f"EMU_EXPORT const char* emu_sig_{i}() {{ return emu_signature(&{expr}); }}"
        )
    return "\n".join(lines) + "\n"
