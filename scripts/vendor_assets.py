"""Copy the pinned front-end files from node_modules/ into _vendor/assets/.

Sphinx copies _vendor/ to the site root (``html_extra_path`` in _config.yml), so the built
book serves MathJax, require.js, the widget manager and anywidget's front end itself and
never asks a CDN. Run by ``make book`` and ``make test`` after ``npm ci``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE = ROOT / "node_modules"
OUT = ROOT / "_vendor" / "assets"

# (source under node_modules/, destination under _vendor/assets/, ignore patterns)
COPIES = [
    ("requirejs/require.js", "require.min.js", ()),
    ("anywidget/dist/index.js", "anywidget/index.js", ()),
    ("@jupyter-widgets/html-manager/dist", "html-manager", ("*.map", "embed.js*", "libembed*")),
    # MathJax 3: the component, its TeX extensions and its fonts (speech rules not needed).
    ("mathjax/es5", "mathjax", ("sre", "*.map")),
]


def main() -> int:
    if not NODE.is_dir():
        print("error: node_modules/ is missing: run `npm ci` (make does it).", file=sys.stderr)
        return 1
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    for src, dst, ignore in COPIES:
        source, target = NODE / src, OUT / dst
        if not source.exists():
            print(f"error: {source} is missing: run `npm ci`.", file=sys.stderr)
            return 1
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns(*ignore))
        else:
            shutil.copy2(source, target)
    shutil.copy2(ROOT / "book" / "_assets" / "require-config.js", OUT / "require-config.js")
    size = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"front-end files copied to {OUT.relative_to(ROOT)} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
