"""Lines of a solution compared by shape: what a text must not hold, even with its names changed.

A line is tokenized; every variable's name becomes ID and every number NUM, so `dSs[r][jj] =
p * (dpd * z - Ds[r])` and `dSs[ii][y] = p * (dpd * z - Ds[ii])` have one shape. The names a
line calls or reaches (`dropout_factor(`, `row_dot<Dt>(`, `wmma::mma_sync`, `tape.no_grad`),
keywords (`for`, `with`, ...) and operators stay themselves: a different function is a
different line, and the mathematics a note states (`exp(S_ij - m_i)`, `acc = alpha acc + P V`)
is not the code (`expf(s[c] - m_ref)`, `acc[c] = alpha * acc[c] + pv`). A text holds a line
when its token shape contains, as a contiguous run, the shape of the line or of one of its
parts: the statement without its type (`const float`) and `;`, the right-hand side of an
assignment, the body after a `for (...)` or `if (...)` header, and each call with its
arguments (`dropout_factor(drop, (bh * Nq + i) * Nk + j)` is a line's worth of answer inside a
longer line). An argument alone is not a part: `(bh * Nq + i) * Nk + j` is the index of any
(B, H, Nq, Nk) array, which the given code and the kernel's header write too.

A part shorter than MIN_TOKENS is not compared. Six tokens or fewer is the grammar of any
equation or sentence (`ID = ID * ID`, `ID += ID`, `ID = ID . ID`); from seven on a shape is a
particular combination that only writing the line reproduces: `with tape.no_grad():` (7),
`alpha = expf(m - m_ref)` (7), a call with its arguments (`mma_sync(acc, a, b, acc)`, 10), a
ternary. Three kinds of line are not compared at all, as they are the file's scaffolding,
which its given code repeats by design: a bare control header (`for (int c = 0; c < Dt /
LANES; ++c) {`, `if (!DETERMINISTIC) {`: which elements, said in words by every note), an
index or pointer declaration (`const int col = lane + c * LANES;`, `float* p = P + row *
Nk;`: where a thread works, as the kernel's layout comment states), and a declaration that
only fills in a constant (`float sv = 0.0f, sk = 0.0f;`).
"""

from __future__ import annotations

import re

MIN_TOKENS = 7

TOKEN = re.compile(r"""
    (?P<num>0[xX][0-9a-fA-F]+[uUlL]*|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?[fFuUlL]*)
  | (?P<id>[A-Za-z_]\w*)
  | (?P<op><<=|>>=|->|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||\+=|-=|\*=|/=|%=|&=|\|=|\^=|::|\*\*)
  | (?P<ch>\S)
""", re.X)
KEYWORDS = {"for", "if", "else", "while", "do", "return", "break", "continue", "with", "def",
            "not", "and", "or", "in", "is", "None", "True", "False", "lambda", "raise", "pass"}
TYPES = {"const", "float", "int", "bool", "double", "unsigned", "long", "auto", "char",
         "short", "static", "constexpr", "__half", "__nv_bfloat16", "volatile"}
ASSIGN = {"=", "+=", "-=", "*=", "/="}


def _named(toks, n: int) -> bool:
    """Whether the identifier toks[n] names what is called or reached (`f(`, `f<T>(`, `.f`,
    `::f`): a name that cannot change without changing the line, so it stays itself."""
    vals = [v for _, v in toks]
    if n > 0 and vals[n - 1] in (".", "::"):
        return True
    if n + 1 < len(vals) and vals[n + 1] == "(":
        return True
    if n + 1 < len(vals) and vals[n + 1] == "<":  # a template call: f<A, B>(...)
        for k in range(n + 2, min(n + 8, len(vals))):
            if vals[k] in (";", "(", ")", "=", "<"):
                return False
            if vals[k] == ">":
                return k + 1 < len(vals) and vals[k + 1] == "("
    return False


def tokens(text: str) -> list[tuple[str, str]]:
    """(kind, text) of each token: kind 'num', 'id', 'name' (called or reached: kept as it is),
    'kw', 'type' or 'op'."""
    out = []
    for m in TOKEN.finditer(text):
        kind, value = m.lastgroup, m.group()
        if kind == "id":
            kind = "kw" if value in KEYWORDS else "type" if value in TYPES else "id"
        out.append(("op" if kind == "ch" else kind, value))
    return [("name", v) if k == "id" and _named(out, n) else (k, v)
            for n, (k, v) in enumerate(out)]


def shape(toks) -> list[str]:
    """The shape of `toks`: ID for a variable's name, NUM for a number; called and reached
    names, keywords and operators as they are."""
    return ["ID" if kind in ("id", "type") else "NUM" if kind == "num" else value
            for kind, value in toks]


def code_of(line: str, comment: str = "//") -> str:
    """A solution line without its comment (the comment explains; the code is the answer)."""
    return line.split(comment)[0].strip() if comment in line else line.strip()


def _closing(toks, k: int) -> int:
    """The index of the bracket that closes the one at toks[k] (len(toks) if none)."""
    depth = 0
    for n in range(k, len(toks)):
        depth += toks[n][1] == "("
        depth -= toks[n][1] == ")"
        if depth == 0:
            return n
    return len(toks)


def scaffolding(toks) -> bool:
    """A bare control header, an integer index declaration or a zero-filling declaration."""
    vals = [v for _, v in toks]
    if vals and vals[0] in ("for", "if", "while", "else") or vals[:2] == ["}", "else"]:
        head = _closing(toks, vals.index("(")) if "(" in vals else 0
        return all(v in ("{", "}", ";") for v in vals[head + 1:])
    if vals and toks[0][0] == "type":
        declarator = [v for k, v in toks if k != "type"]
        if "int" in vals[:3] or declarator[:1] == ["*"]:
            return True
        rest = " ".join(shape([t for t in toks if t[0] != "type"]))
        return re.fullmatch(r"(ID = -? ?(NUM|ID) , )*ID = -? ?(NUM|ID)( ;)?", rest) is not None
    return vals in ([], ["{"], ["}"], ["};"])


def parts(line: str, comment: str = "//") -> list[list[str]]:
    """The shapes a text must not hold for one solution line: the statement (no type, no
    trailing `;` or `{`), the right-hand side of its assignment, the body after a control
    header, every call with its arguments; each of at least MIN_TOKENS tokens."""
    toks = tokens(code_of(line, comment))
    if not toks or scaffolding(toks):
        return []
    while toks and toks[0][0] == "type":
        toks = toks[1:]
    while toks and toks[-1][1] in (";", "{", ":") and not (toks[0][1] == "with"):
        toks = toks[:-1]
    pieces = [toks]
    vals = [v for _, v in toks]
    if vals and vals[0] in ("for", "if", "while") and "(" in vals:
        body = toks[_closing(toks, vals.index("(")) + 1:]
        pieces.append(body)
        toks, vals = body, [v for _, v in body]
    for n, v in enumerate(vals):
        if v in ASSIGN:
            pieces.append(toks[n + 1:])
            break
    for n, (_, v) in enumerate(toks):
        if v == "(" and n > 0 and (toks[n - 1][0] == "name" or toks[n - 1][1] == ">"):
            start = n - 1
            if toks[start][1] == ">" and "<" in vals[:start]:  # a template call: f<T>(...)
                start = max(k for k in range(start) if vals[k] == "<") - 1
            end = _closing(toks, n)
            pieces.append(toks[max(start, 0):end + 1])
    out = []
    for p in pieces:
        s = shape(p)
        if len(s) >= MIN_TOKENS and s not in out:
            out.append(s)
    return out


def holds(text: str, part: list[str]) -> bool:
    """Whether `text`'s shape contains `part` as a contiguous run of tokens."""
    return f" {' '.join(part)} " in f" {' '.join(shape(tokens(text)))} "


def leaks(text: str, solution) -> list[str]:
    """The solution lines, given as (where, line, comment mark), whose shape or a part's shape
    `text` holds."""
    return [f"{where}: {line.strip()!r}" for where, line, comment in solution
            if any(holds(text, p) for p in parts(line, comment))]
