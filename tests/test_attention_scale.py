"""The attention map at scale: 6 layers x 12 heads x 512 tokens in Chromium (issue 10).

A synthetic attention (random scores, each row a softmax, fixed seed) of MiniLM's size at its
longest context: the widget's saved state must stay under 8 MB. The test measures (and
prints) the first complete draw, from the moment the widget's root element appears (its
render starts) and from the navigation, next to a 4-token map's (the cost of require.js and
the widget manager alone), and the time a key press on the head slider or a hover over the
large map takes to reach the screen. The bounds asserted are generous and on the CPU time of
the page's main thread, which a loaded machine hardly stretches (the machine running the tests
is shared); the clock times and medians are printed for the report."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
from ipywidgets.embed import dependency_state

from tests.browser import main_thread_cpu, serve, site_extension, watch, widget_page
from tests.conftest import ASSETS
from tfbook.widgets.attention import AttentionExample, AttentionMap

L, H, T = 6, 12, 512  # all of MiniLM's heads at its longest context
HOSTILE = "<img src=x onerror=alert(1)>"
PAGE_BUDGET = 8_000_000  # bytes of the widget's saved state in the page
REPEATS = 5  # key presses and hovers measured; the median is reported

# True once the widget shows everything: every small map, every query and key token.
DRAWN_JS = """([count, tokens]) => {
  const root = document.querySelector('.tfw');
  if (!root || root.querySelectorAll('.tfw-grid canvas').length !== count) return false;
  const strips = root.querySelectorAll('.tfw-strip');
  return strips.length === 2 && strips[0].children.length === tokens &&
         strips[1].children.length === tokens;
}"""

# Before the page loads: note when the widget's root element appears (its render starts).
RENDER_START_JS = """new MutationObserver((_, observer) => {
  if (document.querySelector('.tfw')) {
    window.tfwRenderAt = performance.now();
    observer.disconnect();
  }
}).observe(document, { childList: true, subtree: true });"""

# Arm a stopwatch: it starts at the next event of this type and stops after the next frame
# is drawn (a frame callback, then a task: the browser has painted the frame by then).
ARM_JS = """(type) => {
  window.tfwStop = undefined;
  document.addEventListener(type, () => {
    const start = performance.now();
    requestAnimationFrame(() => setTimeout(() => { window.tfwStop = performance.now() - start; }));
  }, { capture: true, once: true });
}"""


def synthetic_attention(seed: int = 0) -> torch.Tensor:
    """(L, H, T, T) rows of softmax(random scores): every weight non-zero, none of the
    structure (a few large weights) that makes real maps compress well."""
    scores = torch.randn(L, H, T, T, generator=torch.Generator().manual_seed(seed))
    return torch.softmax(scores, dim=-1)  # (L, H, T, T)


def state_bytes(widget: AttentionMap) -> int:
    """The bytes the widget adds to a page: its saved state, escaped as the book writes it.
    (widget_page's file also holds every other widget this process made.)"""
    state = {"version_major": 2, "version_minor": 0,
             "state": dependency_state([widget], drop_defaults=False)}
    return len(site_extension().escape_widget_state(state).encode("utf-8"))


def first_draw(browser, base_url: str, name: str, count: int, tokens: int):
    """Open the page `name`; wait for the complete first draw. Returns the page, its log, the
    times (ms since the navigation started) of the widget's render and of its first draw, the
    CPU ms the page's main thread used from the navigation to the first draw and a reader of
    that CPU time."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.add_init_script(RENDER_START_JS)
    log = watch(page, base_url)
    cpu = main_thread_cpu(page)
    cpu_start = cpu()
    page.goto(base_url + name, wait_until="commit")
    drawn_at = page.wait_for_function(f"(a) => ({DRAWN_JS})(a) && performance.now()",
                                      arg=[count, tokens], polling="raf",
                                      timeout=60000).json_value()
    return (page, log, page.evaluate("() => window.tfwRenderAt"), drawn_at, cpu() - cpu_start,
            cpu)


def test_512_tokens_72_heads_page_size_and_speed(browser, tmp_path: Path) -> None:
    tokens = [f"t{i}" for i in range(T - 1)] + [HOSTILE]
    widget = AttentionMap(AttentionExample("512 tokens", tokens, synthetic_attention()))
    page_file = widget_page(widget, ASSETS, tmp_path)
    small = AttentionMap(AttentionExample("4 tokens", list("abcd"), torch.full((4, 4), 0.25)))
    small_file = widget_page(small, ASSETS, tmp_path, "small.html")
    size = state_bytes(widget)
    with serve(tmp_path) as base_url:
        # the cost of the page machinery alone: a 4-token map (require.js, widget manager)
        page, _, _, small_drawn_at, small_cpu, _ = first_draw(browser, base_url,
                                                               small_file.name, 1, 4)
        page.close()
        page, log, render_at, drawn_at, load_cpu, cpu = first_draw(browser, base_url,
                                                                   page_file.name, L * H, T)
        root = page.locator(".tfw").first
        caption = root.locator(".tfw-note").first

        head = root.locator("input[aria-label=head]")
        head.focus()
        key_ms, key_cpu = [], []
        for expected in range(1, REPEATS + 1):
            page.evaluate(ARM_JS, "keydown")
            cpu_start = cpu()
            page.keyboard.press("ArrowRight")
            key_ms.append(page.wait_for_function("() => window.tfwStop").json_value())
            key_cpu.append(cpu() - cpu_start)
            assert f"head {expected}:" in caption.inner_text()
            assert page.evaluate("() => document.activeElement.getAttribute('aria-label')") \
                == "head"

        big = root.locator("canvas").first.bounding_box()
        hover_ms, hover_cpu = [], []
        for i in range(REPEATS):
            y = big["y"] + big["height"] * (0.1 + 0.15 * i)
            page.evaluate(ARM_JS, "mousemove")
            cpu_start = cpu()
            page.mouse.move(big["x"] + 5, y)
            hover_ms.append(page.wait_for_function("() => window.tfwStop").json_value())
            hover_cpu.append(cpu() - cpu_start)
        page.mouse.move(big["x"] + 5, big["y"] + big["height"] - 2)  # the last query: HOSTILE
        page.wait_for_function("(t) => document.querySelector('.tfw-strip').innerText"
                               ".includes(t)", arg=HOSTILE.replace(" ", "␣"))
        assert root.locator("img").count() == 0
        page.close()
    key, hover = statistics.median(key_ms), statistics.median(hover_ms)
    widget_ms = drawn_at - render_at
    print(f"\n{L} layers x {H} heads x {T} tokens: state {size / 1e6:.2f} MB (the page file "
          f"{page_file.stat().st_size / 1e6:.2f} MB); first draw "
          f"{widget_ms:.0f} ms after the widget's render started, {drawn_at:.0f} ms after "
          f"the navigation (a 4-token map: {small_drawn_at:.0f} ms); key press {key:.1f} ms "
          f"(median of {[round(x, 1) for x in key_ms]}), hover {hover:.1f} ms (median of "
          f"{[round(x, 1) for x in hover_ms]})")
    key_cpu, hover_cpu = statistics.median(key_cpu), statistics.median(hover_cpu)
    print(f"CPU time of the page's main thread: the page's load to its first draw {load_cpu:.0f} "
          f"ms (a 4-token map: {small_cpu:.0f} ms), key press {key_cpu:.1f} ms, hover "
          f"{hover_cpu:.1f} ms (medians)")
    assert size <= PAGE_BUDGET, f"the state holds {size:,} bytes, more than {PAGE_BUDGET:,}"
    # the bounds are on CPU time, which a loaded machine hardly stretches; the clock's are printed
    assert load_cpu < 5000, f"the load and first draw took {load_cpu:.0f} ms of CPU"
    assert key_cpu < 1000 and hover_cpu < 1000, \
        f"redraws took {key_cpu:.0f} ms (key), {hover_cpu:.0f} ms (hover) of CPU"
    assert not log.dialogs, f"a script ran from the data: {log.dialogs}"
    assert not (log.page_errors or log.console_errors or log.foreign_requests), log
