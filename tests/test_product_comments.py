"""Product code speaks of the product: no comment or docstring in the product packages
cites a benchmark run or a revision. A default's reason is a property of the system;
the measurement that supports it lives in docs/benchmarks/."""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "controller", "predict", "spark_stream", "dsched")

# What cites a run rather than the product. Short and precise on purpose: each phrase
# names a run or a result of one, never an interface ("bench/ reads this field").
CITES_A_RUN = re.compile(
    r"benchmark run|live benchmark's|the benchmark's|series at [0-9a-f]{7}|-dirty|\bseed\d{3}\b",
    re.IGNORECASE,
)
HEX_WORD = re.compile(r"\b[0-9a-f]{7,40}\b")


def prose(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment and every string statement (docstrings)."""
    source = path.read_text()
    out = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            out += [(node.lineno + i, line) for i, line in enumerate(node.value.value.split("\n"))]
    return out


def product_prose() -> list[tuple[str, int, str]]:
    return [
        (str(path.relative_to(ROOT)), line, text)
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, text in prose(path)
    ]


def test_the_scan_reads_comments_and_docstrings_of_every_package():
    files = {name.split("/")[0] for name, _, _ in product_prose()}
    assert files == set(PACKAGES)


def test_no_comment_or_docstring_cites_a_run():
    hits = [
        f"{name}:{line}: {text.strip()}"
        for name, line, text in product_prose()
        if CITES_A_RUN.search(text)
    ]
    assert not hits, "state the reason as a property of the system:\n" + "\n".join(hits)


def test_no_comment_or_docstring_cites_a_revision():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    found = [
        (name, line, text, word)
        for name, line, text in product_prose()
        for word in HEX_WORD.findall(text)
    ]
    words = sorted({word for *_, word in found})
    answer = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "--batch-check=%(objecttype)"],
        input="".join(f"{word}^{{commit}}\n" for word in words),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    commits = {word for word, kind in zip(words, answer, strict=True) if kind == "commit"}
    hits = list(
        dict.fromkeys(
            f"{name}:{line}: {t.strip()}" for name, line, t, word in found if word in commits
        )
    )
    assert not hits, "a comment names a commit of this repository:\n" + "\n".join(hits)
