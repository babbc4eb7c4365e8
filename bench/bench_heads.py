"""The head explorer's speed in Chromium: SmolLM2-135M's 30 x 9 = 270 heads on four texts,
opened from its saved state (no kernel), as the chapter inside_the_model shows it.

    python bench/bench_heads.py   # writes book/inside/data/heads_widget_speed.json

The page is the one the browser tests write (tests/browser.py `widget_page`: the book's
widget manager and escaping), served from 127.0.0.1 to headless Chromium (Debian's, or
$CHROMIUM). The times are the widget's own (heads.js `headsTimes`, performance.now() in the
page); every step waits for a condition in the page, never for a fixed time:

1. first draw: FIRST_DRAWS fresh loads of the page at 1,280 px and as many at 390 px (a
   phone); each time, the widget's render() to its first complete drawing: the grid of 270
   cells coloured, the maps of the four texts inflated, the selected head's pattern and
   both axes' token labels drawn; and when that drawing ended, counted from the page's
   navigation (the widget manager's start and the script's loading included);
2. a click: CLICKS cells clicked, each another head (so each repaints the pattern), at
   1,280 px; the click to the pattern drawn (`clicks`), and to the next animation frame, the
   one that shows it (`clickFrames`).

The grid is coloured by two scores computed here from the four texts' patterns (the mean
weight on the previous token, and on the first token, over the queries after the first):
stand-ins with the real range of values, not the chapter's scores.

Recorded: every time, its median, minimum and maximum, the size of the page's maps, the
machine() record (versions, CPU, load average at the start and at the end) and Chromium's
version. Other processes compete for the two cores when the load average is above 2: the
times are then longer than on a quiet machine, and the record says so.
"""

import os
import sys

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # before torch starts its thread pool

import json  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402
from tqdm import tqdm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_explorer import summary  # noqa: E402  (median, range and every value)
from bench_model import machine  # noqa: E402

from tests.browser import CHROMIUM_ARGS, chromium_path, serve, watch, widget_page  # noqa: E402
from tfbook.checkpoints.smollm2 import load_smollm2, load_smollm2_tokenizer  # noqa: E402
from tfbook.widgets import HeadExplorer  # noqa: E402
from tfbook.widgets.heads import head_example  # noqa: E402

RESULTS = ROOT / "book" / "inside" / "data" / "heads_widget_speed.json"
ASSETS = ROOT / "_vendor" / "assets"  # the book's front-end files (make vendor)
TEXTS = [
    "The cat sat on the mat. The cat sat on the mat.",
    "When Mary and John went to the store, John gave a drink to Mary.",
    "The Eiffel Tower is in the city of Paris, the capital of France.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
]
FIRST_DRAWS, CLICKS = 9, 30
VIEWPORTS = {"desktop": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}


def stand_in_scores(weights: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per head (L, H): the mean weight on the previous token and on the first token, over
    every query after the first of every text."""
    previous = torch.stack([w.diagonal(-1, -2, -1).mean(-1) for w in weights]).mean(0)
    first = torch.stack([w[..., 1:, 0].mean(-1) for w in weights]).mean(0)
    return {"previous-token": previous, "first-token sink": first}


def first_draw(page, url: str) -> tuple[float, float]:
    """A fresh load: render() to the first complete drawing, and that drawing's end counted
    from the page's navigation."""
    page.goto(url)
    root = page.locator(".tfw-heads").first
    root.wait_for(timeout=120_000)
    page.wait_for_function("(r) => r.headsTimes && r.headsTimes.firstDraw !== null",
                           arg=root.element_handle(), timeout=120_000)
    times = root.evaluate("(r) => r.headsTimes")
    return times["firstDraw"], times["drawnAt"]


def main() -> None:
    if not (ASSETS / "require.min.js").exists():
        sys.exit(f"the front-end files are missing in {ASSETS}: run `make vendor`")
    record = machine()  # the load as the run starts
    model, tokenizer = load_smollm2(), load_smollm2_tokenizer()
    examples = [head_example(model, tokenizer, text) for text in TEXTS]
    scores = stand_in_scores([e.weights for e in examples])
    widget = HeadExplorer.from_model(model, tokenizer, TEXTS, scores, title="SmolLM2-135M")
    L, H = widget.heads
    heads = [((7 * n + 3) % L, (4 * n + 1) % H) for n in range(CLICKS)]  # all different
    assert len(set(heads)) == CLICKS
    steps = FIRST_DRAWS * len(VIEWPORTS) + CLICKS
    first: dict[str, list[float]] = {}
    drawn_at: dict[str, list[float]] = {}
    with (tempfile.TemporaryDirectory() as folder, serve(Path(folder)) as base_url,
          sync_playwright() as playwright, tqdm(total=steps, desc="bench_heads") as bar):
        page_file = widget_page(widget, ASSETS, Path(folder))
        browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True,
                                             args=CHROMIUM_ARGS)
        logs = []
        for name, viewport in VIEWPORTS.items():
            page = browser.new_page(viewport=viewport)
            logs.append(watch(page, base_url))
            first[name], drawn_at[name] = [], []
            for _ in range(FIRST_DRAWS):
                ms, at = first_draw(page, base_url + page_file.name)
                first[name].append(ms)
                drawn_at[name].append(at)
                bar.update()
            if name != "desktop":
                page.close()
                continue
            root = page.locator(".tfw-heads").first
            for n, (layer, head) in enumerate(heads):
                root.locator(".tfw-cell").nth(layer * H + head).click()
                page.wait_for_function(
                    "([r, l, h, n]) => r.headsShown.layer === l && r.headsShown.head === h "
                    "&& r.headsTimes.clickFrames.length > n",
                    arg=[root.element_handle(), layer, head, n])
                bar.update()
            times = root.evaluate("(r) => r.headsTimes")
            page.close()
        version = browser.version
        browser.close()
    errors = [e for log in logs for e in log.page_errors + log.console_errors]
    if errors:
        sys.exit(f"the page reported errors: {errors}")
    result = {
        "model": "SmolLM2-135M-Instruct", "heads": [L, H], "texts": TEXTS,
        "tokens": [e["T"] for e in widget.examples], "page_maps_characters": len(widget.data),
        "scores": "stand-ins: mean weight on the previous token and on the first token",
        "viewports": VIEWPORTS,
        "first_draw_ms": summary(first["desktop"]),
        "drawn_after_navigation_ms": summary(drawn_at["desktop"]),
        "first_draw_phone_ms": summary(first["phone"]),
        "drawn_after_navigation_phone_ms": summary(drawn_at["phone"]),
        "click_ms": summary(times["clicks"]), "click_to_frame_ms": summary(times["clickFrames"]),
        "machine": machine(chromium=version,
                           load_average_1min_at_start=record["load_average_1min"]),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    m = result["machine"]
    print(f"{m['cpu']} x{m['cpu_count']}, Chromium {version}, load "
          f"{m['load_average_1min_at_start']:.1f} -> {m['load_average_1min']:.1f}")
    for name in ("first_draw_ms", "drawn_after_navigation_ms", "first_draw_phone_ms",
                 "drawn_after_navigation_phone_ms", "click_ms", "click_to_frame_ms"):
        r = result[name]
        print(f"{name:32s} median {r['median']:7.1f}  ({r['min']:.1f}-{r['max']:.1f}, n={r['n']})")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
