"""The default corpus: about a megabyte of English from the Python 3.11 standard library.

The text is the help topics of `pydoc_data.topics` followed by the docstrings of a fixed list
of standard-library modules, in a fixed order. It ships with the package, built once from
Python 3.11.7 (`CORPUS_PYTHON`), so every process, kernel or script, on every Python release
reads the same bytes, whose SHA-256 (`CORPUS_SHA256`) `stdlib_corpus()` checks.

Why ship it rather than read the running interpreter's docstrings: what a process holds is
not the standard library as installed. An interactive kernel swaps `builtins.input` and
`pdb.Pdb` for its own (about 14,000 characters fewer), libraries patch functions at import,
and the docstrings change between patch releases. `build_stdlib_corpus()` rebuilds the text
from the running Python in a fresh, isolated interpreter (`python -I -S`), which is how the
shipped file was made (`scripts/build_corpus.py`).

`stress_lines()` adds short lines that break naive tokenizers (accents, CJK, emoji, ...).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import inspect
import lzma
import subprocess
import sys
import types
import warnings
from pathlib import Path

CORPUS_FILE = Path(__file__).resolve().parent / "data" / "stdlib_corpus.txt.xz"
CORPUS_PYTHON = "3.11.7"  # the release whose standard library the shipped text was read from
CORPUS_SHA256 = "267d723287af8abc74df91cffff6c5895d532513e70ed03ba715b8d9802da755"

# Modules whose docstrings join the corpus, in this order. Chosen for plain English prose,
# no import side effects, and the same contents on every platform (no `os`, `socket`, ...).
CORPUS_MODULES: tuple[str, ...] = (
    "builtins", "collections", "itertools", "functools", "operator", "string", "re",
    "textwrap", "difflib", "json", "csv", "datetime", "calendar", "decimal", "fractions",
    "random", "statistics", "math", "pathlib", "tempfile", "glob", "fnmatch", "io",
    "pickle", "copy", "pprint", "enum", "dataclasses", "typing", "abc", "contextlib",
    "argparse", "logging", "threading", "queue", "subprocess", "email.message",
    "urllib.parse", "http.client", "html.parser", "xml.etree.ElementTree", "zipfile",
    "tarfile", "gzip", "hashlib", "hmac", "secrets", "struct", "codecs", "unicodedata",
    "gettext", "inspect", "ast", "dis", "traceback", "warnings", "unittest", "doctest",
    "heapq", "bisect", "array", "weakref", "types", "sched", "concurrent.futures",
    "sqlite3", "configparser", "shlex", "cmd", "timeit", "cProfile", "pdb", "tokenize",
    "ipaddress", "uuid", "base64", "binascii",
)


def _source_docstrings(module: types.ModuleType) -> dict[str, str]:
    """Docstrings of the functions and classes defined at the top of a module's source file."""
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return {}  # a module written in C has no source to read
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {node.name: ast.get_docstring(node, clean=False) or ""
            for node in tree.body if isinstance(node, defs)}


def _module_docstrings(name: str) -> list[str]:
    """Docstrings of one module: the module, then its classes/functions and their methods.

    Some libraries change the standard library at run time: importing `torch.package` swaps
    `inspect.getfile` for its own, importing `transformers` adds methods to `logging.Logger`.
    A swapped function is read from the module's source and an added method is left out, so
    the corpus does not depend on what else the process has imported.
    """
    module = importlib.import_module(name)
    replaced = _source_docstrings(module)
    docs = [module.__doc__ or ""]
    for attr, obj in sorted(vars(module).items()):
        if attr.startswith("_"):
            continue
        if getattr(obj, "__module__", None) != module.__name__:
            # a Python function defined in this source but swapped by another library (C
            # accelerators, e.g. heapq's from _heapq, are builtins and stay out, as always)
            if attr in replaced and inspect.isfunction(obj):
                docs.append(replaced[attr])
            continue
        if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj):
            docs.append(obj.__doc__ or "")
        if inspect.isclass(obj):
            for method, member in sorted(vars(obj).items()):
                # skip methods other libraries attach to stdlib classes at run time
                # (transformers adds `warning_once` and others to logging.Logger)
                owner = getattr(member, "__module__", module.__name__)
                if not method.startswith("_") and owner == module.__name__:
                    docs.append(getattr(member, "__doc__", None) or "")
    return [inspect.cleandoc(d) for d in docs if isinstance(d, str) and d.strip()]


def _read_standard_library() -> str:
    """The corpus as this process reads it (see `build_stdlib_corpus` for a clean process)."""
    from pydoc_data.topics import topics

    parts = [topics[key].strip() for key in sorted(topics)]
    with warnings.catch_warnings():  # reading typing.io/typing.re warns; text is unchanged
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in CORPUS_MODULES:
            parts.extend(_module_docstrings(name))
    return "\n\n".join(parts) + "\n"


def build_stdlib_corpus() -> str:
    """Rebuild the corpus from the running Python's standard library, in a fresh interpreter.

    `python -I -S` runs this file with no site-packages, no user site and no environment
    variables, so nothing has swapped or patched a docstring. On Python `CORPUS_PYTHON` the
    result equals `stdlib_corpus()`; on another release its docstrings differ a little.
    """
    done = subprocess.run([sys.executable, "-I", "-S", str(Path(__file__).resolve())],
                          capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"reading the standard library in a fresh interpreter failed: "
                           f"{done.stderr.decode(errors='replace')[-500:]}")
    return done.stdout.decode("utf-8")


def corpus_sha256(text: str) -> str:
    """SHA-256 of a text's UTF-8 bytes, as hex: the fingerprint `CORPUS_SHA256` is."""
    if not isinstance(text, str):
        raise TypeError(f"corpus_sha256 expects a str, got {type(text).__name__}")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@functools.cache
def _shipped_corpus() -> str:
    try:
        text = lzma.decompress(CORPUS_FILE.read_bytes()).decode("utf-8")
    except (OSError, lzma.LZMAError, UnicodeDecodeError) as error:
        raise RuntimeError(f"the corpus file {CORPUS_FILE} is missing or damaged ({error}); "
                           f"scripts/build_corpus.py rebuilds it on Python {CORPUS_PYTHON}"
                           ) from error
    if corpus_sha256(text) != CORPUS_SHA256:
        raise RuntimeError(f"the corpus file {CORPUS_FILE} has SHA-256 {corpus_sha256(text)}, "
                           f"expected {CORPUS_SHA256}: it was changed or damaged")
    return text


def stdlib_corpus(max_bytes: int | None = None) -> str:
    """About 1 MB of English: `pydoc_data.topics` then stdlib docstrings (Python 3.11.7).

    The same text in every process (see the module docstring). With `max_bytes`, the text is
    cut at the last line break that fits in that many UTF-8 bytes, e.g.
    `stdlib_corpus(200_000)` for a quick experiment.
    """
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)
                                  or max_bytes < 0):
        raise ValueError(f"max_bytes must be a non-negative int or None, got {max_bytes!r}")
    text = _shipped_corpus()
    if max_bytes is None:
        return text
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    cut = data[:max_bytes]
    newline = cut.rfind(b"\n")
    return cut[: newline + 1 if newline >= 0 else 0].decode("utf-8", errors="ignore")


_STRESS_LINES: tuple[str, ...] = (
    "café, naïve, façade, résumé, Ångström, São Paulo, Zürich, Dvořák, Łódź",
    "cafe\u0301 with a combining acute, n\u0303 and a\u0308\u0304 stacked marks",
    "ÉCOLE FRANÇAISE À L'ÉTÉ; İstanbul ve Iğdır; Straße and STRASSE",
    "机器学习是人工智能的一个分支。深度学习使用多层神经网络来学习数据的表示。",
    "東京は日本の首都です。ひらがな、カタカナ、漢字が混ざっています。",
    "한국어 문장도 토큰화할 수 있습니다. 안녕하세요, 세계!",
    "emoji: 😀 🎉 👍🏽 ❤️ and a family 👨\u200d👩\u200d👧\u200d👦 and flags 🇯🇵🇫🇷🇺🇸",
    "العربية تُكتب من اليمين إلى اليسار، وكذلك العبرية: שלום עולם",
    "mixed direction: the word שלום means peace and سلام too",
    "zero\u200bwidth\u200bspaces and a joiner a\u200db and a non\u00a0breaking\u00a0space",
    "tabs\tbetween\twords and  double  spaces   and trailing spaces   ",
    "line one\nline two\r\nline three\n\n\nafter blank lines",
    "    leading spaces, then words",
    "numbers 0 12 345 6789 3.14159 1,000,000 2026-11-21 0x1F 1e-10 ١٢٣",
    "contractions: don't, I'm, we've, they'll, she'd, it's, DON'T, I'M, y'all",
    "punctuation!!! ??? ... --- (brackets) [list] {dict} <tag> @user #hash $5 100% a&b",
    "code: def f(x): return x**2  # comment\n    if a != b: print(f'{a=}')",
    "URLs https://example.com/path?q=1&r=2 and e-mail someone@example.org",
    "Ελληνικά γράμματα, кириллица тоже, and ελληνικά lowercase",
    "ａｂｃ fullwidth letters, ﬁ ligature, ① circled, ² superscript, ½ fraction",
    "a" * 50 + " " + "ab" * 30,
    "ÀÁÂÃÄÅàáâãäå ÇçÈÉÊËèéêë ÌÍÎÏìíîï ÑñÒÓÔÕÖòóôõö ÙÚÛÜùúûü",
    "",
    " ",
    "<|endoftext|> looks like a special token but is just text here",
)


def stress_lines() -> list[str]:
    """Hard lines for tokenizers: accents, combining marks, CJK, emoji ZWJ, RTL, odd spaces."""
    return list(_STRESS_LINES)


if __name__ == "__main__":  # build_stdlib_corpus runs this file in a fresh interpreter
    sys.stdout.buffer.write(_read_standard_library().encode("utf-8"))
