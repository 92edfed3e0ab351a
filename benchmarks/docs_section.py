"""Regenerates the `layerserve bench` section of docs/benchmarks.md: the text between the
two markers is replaced, everything outside them is kept byte for byte."""

from __future__ import annotations

from pathlib import Path

BEGIN = "<!-- layerserve bench: begin -->"
END = "<!-- layerserve bench: end -->"


def replace_section(document: str, section: str) -> str:
    """`document` with the text between BEGIN and END replaced by `section`; if it has no
    markers yet, they and the section are appended at its end."""
    start, stop = document.find(BEGIN), document.find(END)
    if start < 0 and stop < 0:
        return document.rstrip("\n") + f"\n\n{BEGIN}\n{section.strip()}\n{END}\n"
    if start < 0 or stop < start or document.count(BEGIN) != 1 or document.count(END) != 1:
        raise ValueError(f"the document needs exactly one {BEGIN} followed by one {END}")
    return document[: start + len(BEGIN)] + f"\n{section.strip()}\n" + document[stop:]


def update_docs(path: Path, section: str) -> None:
    path.write_text(replace_section(path.read_text(), section))
