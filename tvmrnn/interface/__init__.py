"""One module per user verb (compile, run, inspect, ...): resolved arguments as a dataclass, the work as numbered stages.

`tvmrnn.cli` only parses the command line and calls these.
"""

from __future__ import annotations

import json


def target_words(target: str) -> str:
    """A resolved target (TVM prints it as JSON) in a few words: 'cuda sm_90a', 'llvm znver5'."""
    try:
        spec = json.loads(target)
    except ValueError:
        return target
    if not isinstance(spec, dict):
        return target
    detail = spec.get("arch") or spec.get("mcpu") or spec.get("tag") or ""
    return f"{spec.get('kind', '?')} {detail}".strip()


def _value_words(key: str, value) -> str:
    if key == "target" and isinstance(value, str):
        return target_words(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "none"
    if isinstance(value, (tuple, list)):
        return ", ".join(str(v) for v in value) or "none"
    return str(value)


def show_args(args, none_means: dict | None = None, skip: tuple = ()) -> str:
    """A verb's resolved arguments as indented `key: value` lines; a None or empty value reads as none_means[key] says
    ("the model's") or is left out."""
    none_means = none_means or {}
    lines = []
    for key, value in vars(args).items():
        unset = value is None or (isinstance(value, (tuple, list, dict)) and not value)
        if key in skip or (unset and key not in none_means):
            continue
        words = none_means[key] if unset else _value_words(key, value)
        lines.append(f"  {key.replace('_', ' ')}: {words}")
    return "\n".join(lines)


def wrap_line(line: str, width: int = 120) -> str:
    """A long output line folded to `width` columns, after its '; ' separators where it can, continuation lines indented
    past the line's own indent."""
    if len(line) <= width:
        return line
    import textwrap

    indent = " " * (len(line) - len(line.lstrip()) + 6)
    parts = [p + "; " for p in line.split("; ")]
    parts[-1] = parts[-1][:-2]
    lines, current = [], ""
    for part in parts:
        if current and len(current) + len(part.rstrip()) > width:
            lines.append(current.rstrip())
            current = indent
        current += part
    lines.append(current.rstrip())
    return "\n".join(textwrap.fill(piece, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
                     for piece in lines)


def echo_wrapped(text: str = "") -> None:
    """print() for a verb's output: no line over 120 columns."""
    print("\n".join(wrap_line(line) for line in str(text).split("\n")))
