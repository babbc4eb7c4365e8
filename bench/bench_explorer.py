"""The model explorer's speed in Chromium, as the model-explorer chapter shows it: the trained
GPT in the page (16-bit weights, the chapter's sentence), opened from its saved state.

    python bench/bench_explorer.py   # writes book/architectures/data/explorer_speed.json

The page is the one the browser tests write (tests/browser.py `widget_page`: the book's
widget manager and escaping), served from 127.0.0.1 to headless Chromium (Debian's, or
$CHROMIUM) at 1,280 px. The times are the widget's own (explorer.js `explorerTimes`, from
performance.now() in the page); every step waits for a condition in the page (the drawing
done, the box shown, the text run), never for a fixed time:

1. first draw: FIRST_DRAWS fresh loads of the page; each time, the explorer's render() to
   its first complete drawing (parsing the page's model and the first forward pass
   included), and when that drawing ended, counted from the page's navigation;
2. a click: every box of the diagram clicked CLICK_ROUNDS times in reading order; the click
   to the box's panel drawn, and to the next animation frame (the one that shows it);
3. typing: TYPINGS texts of 64 tokens (the context) typed in turn; the input event to every
   view drawn for the new text (the page runs the model once a frame, however fast the keys
   come), and the forward pass alone.

Recorded: every time, its median, minimum and maximum, the machine() record (versions, CPU,
load average at the start and at the end) and Chromium's version. Other processes compete
for the two cores when the load average is above 2: the times are then longer than on a
quiet machine, and the record says so.
"""

import os
import sys

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # before torch starts its thread pool

import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from playwright.sync_api import sync_playwright  # noqa: E402
from tqdm import tqdm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_model import machine  # noqa: E402

from tests.browser import CHROMIUM_ARGS, chromium_path, serve, watch, widget_page  # noqa: E402
from tfbook.paths import book_file  # noqa: E402
from tfbook.train.corpus_lm import load_trained_gpt  # noqa: E402
from tfbook.widgets import ModelExplorer  # noqa: E402

RESULTS = ROOT / "book" / "architectures" / "data" / "explorer_speed.json"
ASSETS = ROOT / "_vendor" / "assets"  # the book's front-end files (make vendor)
# the chapter's sentence and box (book/architectures/model_explorer.md, section 3)
TEXT = "The function returns the value of the key in the table, or None when the key is missing."
BOX = "blocks.0.attn.weights"
FIRST_DRAWS, CLICK_ROUNDS, TYPINGS = 9, 2, 12
VIEWPORT = {"width": 1280, "height": 900}
TIMES_JS = "(r) => r.explorerTimes"


def summary(times: list[float]) -> dict:
    """Median, range and every value (ms, to 0.01 ms)."""
    times = [round(t, 2) for t in times]
    return {"median": statistics.median(times), "min": min(times), "max": max(times),
            "n": len(times), "all": times}


def text_of(tokenizer, n_tokens: int, salt: int) -> str:
    """A text of exactly n_tokens tokens, a different one for each salt."""
    base = (f"Call {salt}: the function returns the value of the key in the table, or None "
            "when the key is missing from it. ") * 8
    ids = tokenizer.encode_ordinary(base)
    for cut in range(n_tokens, 0, -1):
        text = tokenizer.decode(ids[:cut])
        if len(tokenizer.encode_ordinary(text)) == n_tokens:
            return text
    raise RuntimeError("no text of that many tokens")


def wait_for_first_draw(page, root) -> dict:
    page.wait_for_function("(r) => r.explorerTimes && r.explorerTimes.firstDraw !== null",
                           arg=root.element_handle(), timeout=120_000)
    return root.evaluate(TIMES_JS)


def main() -> None:
    if not (ASSETS / "require.min.js").exists():
        sys.exit(f"the front-end files are missing in {ASSETS}: run `make vendor`")
    record = machine()  # the load as the run starts
    model, tokenizer = load_trained_gpt(book_file("learning/data/training_gpt"))
    widget = ModelExplorer.from_page_model(model, tokenizer, TEXT, box=BOX)
    keys = [b["key"] for b in widget.diagram["boxes"]]
    texts = [text_of(tokenizer, 64, salt) for salt in range(TYPINGS)]
    steps = FIRST_DRAWS + CLICK_ROUNDS * len(keys) + TYPINGS
    with (tempfile.TemporaryDirectory() as folder, serve(Path(folder)) as base_url,
          sync_playwright() as playwright, tqdm(total=steps, desc="bench_explorer") as bar):
        page_file = widget_page(widget, ASSETS, Path(folder))
        browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True,
                                             args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        log = watch(page, base_url)
        first, shown_at = [], []
        for _ in range(FIRST_DRAWS):
            page.goto(base_url + page_file.name)
            root = page.locator(".tfw-explorer").first
            root.wait_for(timeout=120_000)
            times = wait_for_first_draw(page, root)
            first.append(times["firstDraw"])
            shown_at.append(times["drawnAt"])
            bar.update()
        for _ in range(CLICK_ROUNDS):
            for key in keys:
                before = len(root.evaluate(TIMES_JS)["clickFrames"])
                root.locator(f'g.tfw-box[data-key="{key}"]').click()
                page.wait_for_function(
                    "([r, key, n]) => r.explorerShown && r.explorerShown.key === key "
                    "&& r.explorerTimes.clickFrames.length > n",
                    arg=[root.element_handle(), key, before])
                bar.update()
        box = root.locator("input[type=text]")
        for text in texts:
            runs = root.evaluate("(r) => r.explorerRun.runs")
            box.fill(text)
            page.wait_for_function("([r, n]) => r.explorerRun.runs === n + 1 && "
                                   "r.explorerTimes.typing.length > 0",
                                   arg=[root.element_handle(), runs])
            assert len(root.evaluate("(r) => r.explorerRun.ids")) == 64
            bar.update()
        times = root.evaluate(TIMES_JS)
        version = browser.version
        browser.close()
    if log.page_errors or log.console_errors:
        sys.exit(f"the page reported errors: {log.page_errors + log.console_errors}")
    result = {
        "text": TEXT, "box": BOX, "viewport": VIEWPORT, "page_model": "float16",
        "first_draw_ms": summary(first), "drawn_after_navigation_ms": summary(shown_at),
        "click_ms": summary(times["clicks"]), "click_to_frame_ms": summary(times["clickFrames"]),
        "typing_64_tokens_ms": summary(times["typing"][-TYPINGS:]),
        "forward_64_tokens_ms": summary(times["runs"][-TYPINGS:]),
        "machine": machine(chromium=version,
                           load_average_1min_at_start=record["load_average_1min"]),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    m = result["machine"]
    print(f"{m['cpu']} x{m['cpu_count']}, Chromium {version}, load "
          f"{m['load_average_1min_at_start']:.1f} -> {m['load_average_1min']:.1f}")
    for name in ("first_draw_ms", "drawn_after_navigation_ms", "click_ms", "click_to_frame_ms",
                 "typing_64_tokens_ms", "forward_64_tokens_ms"):
        r = result[name]
        print(f"{name:28s} median {r['median']:7.1f}  ({r['min']:.1f}-{r['max']:.1f}, n={r['n']})")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
