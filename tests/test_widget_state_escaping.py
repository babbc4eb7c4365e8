"""Hostile text in the widgets' saved state cannot end its <script> element in the built book.

The book's extension (book/_ext/tfbook_site.py) writes every "<" of the state as \\u003c, as
ipywidgets' embedder does for "<script", "</script" and "<!--". The unit tests check the
escaping against that reference and the page hook on myst-nb's own serialisation; the
browser tests build a one-chapter book through `jupyter-book build`, with hostile text in
every text field of every widget, and open it in Chromium: no dialog, no injected element,
every widget drawn, the text shown literally. (Without the extension's hook the injected
<img> elements run their alerts and no widget is drawn.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ipywidgets.embed import escape_script
from myst_nb.core.render import sanitize_script_content
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from sphinx.builders.html._assets import _JavaScript
from sphinx.errors import ExtensionError

from tests.browser import SITE_EXTENSION, serve, site_extension, watch
from tests.conftest import ASSETS, ROOT

site = site_extension()

# Each would end, reopen or comment out the state's <script> if it reached the page raw.
HOSTILE = [
    "</SCRIPT><img src=x onerror=alert(1)>",
    "</script ><img src=x onerror=alert(2)>",
    "</script><img src=x onerror=alert(3)>",
    "<!--<script>",
    "]]></script>",
    "line\u2028separator\u2029paragraph",
    "\"double\" 'single' `back` \\ “curly” &amp; %3C %25",
]
TEXT = " ".join(HOSTILE)  # every hostile string in one text field
STATE = {"state": {"m": {"model_name": "TokenView", "state": {"texts": HOSTILE}}},
         "version_major": 2, "version_minor": 0}


def visible(text: str) -> str:
    """How the widgets show whitespace (visibleText in tfbook/widgets/static/common.js)."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")


@pytest.mark.parametrize("text", HOSTILE)
def test_escaped_state_round_trips_and_has_no_angle_bracket(text: str) -> None:
    state = {**STATE, "extra": {"text": text, "list": [text, text.upper()]}}
    written = site.escape_widget_state(state)
    assert "<" not in written
    assert json.loads(written) == state  # what JSON.parse gives the widget manager
    # nothing is left for ipywidgets' own escaper (case-insensitive <script, </script, <!--)
    assert escape_script(written) == written
    assert json.loads(escape_script(json.dumps(state))) == json.loads(written)


def test_page_handler_rewrites_myst_nbs_state_and_keeps_other_scripts() -> None:
    body = sanitize_script_content(json.dumps(STATE))  # how myst-nb writes it
    assert "</SCRIPT>" in body  # what the build would ship without the extension
    state = _JavaScript("", priority=500, type=site.WIDGET_STATE_TYPE, body=body)
    other = _JavaScript("_static/x.js", priority=200, body="if (a < b) {}")
    context = {"script_files": [other, state]}
    site.escape_widget_states(None, "chapter", "page.html", context, None)
    kept, escaped = context["script_files"]
    assert kept is other and kept.attributes["body"] == "if (a < b) {}"
    assert escaped.attributes == {"type": site.WIDGET_STATE_TYPE,
                                  "body": site.escape_widget_state(STATE)}
    assert (escaped.filename, escaped.priority) == ("", 500)


def test_page_handler_refuses_a_state_that_is_not_json() -> None:
    state = _JavaScript("", type=site.WIDGET_STATE_TYPE, body='{"state": ')
    with pytest.raises(ExtensionError, match=r"widget state of page 'chapter' is not JSON"):
        site.escape_widget_states(None, "chapter", "page.html", {"script_files": [state]}, None)


CHAPTER = '''---
jupytext:
  formats: md:myst
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# Hostile widget text

```{{code-cell}} ipython3
import torch

from tfbook.tokenizers import BPETokenizer
from tfbook.widgets import (AttentionExample, AttentionMap, BPEMergesWidget,
                            PositionalEncodingExplorer, RopeExplorer, SamplingWidget, TokenView)

HOSTILE = {hostile!r}
TEXT = " ".join(HOSTILE)
T = len(HOSTILE)
```

```{{code-cell}} ipython3
tokens = TokenView({{h: BPETokenizer({{}}) for h in HOSTILE}}, [TEXT])
tokens.error = TEXT
tokens
```

```{{code-cell}} ipython3
bpe = BPEMergesWidget("\\n".join(HOSTILE * 2) + "\\n", vocab_size=400, sample=TEXT,
                      pattern="lines", step=1)
bpe.error = TEXT
bpe
```

```{{code-cell}} ipython3
uniform = torch.full((2, 2, T, T), 1 / T)  # (L, H, T, S)
attention = AttentionMap([AttentionExample(HOSTILE[0], HOSTILE, uniform),
                          AttentionExample(TEXT, HOSTILE[:3], uniform[:, :, :3], HOSTILE)],
                         placeholder=TEXT)
attention.error = TEXT
attention
```

```{{code-cell}} ipython3
positions = PositionalEncodingExplorer(d_model=8, labels=HOSTILE)
positions.error = TEXT
positions
```

```{{code-cell}} ipython3
rope = RopeExplorer(head_size=4, n_positions=8)
rope.error = TEXT
rope
```

```{{code-cell}} ipython3
logits = torch.arange(2.0 * T).reshape(2, T)  # (steps, V)
sampling = SamplingWidget(HOSTILE, logits, [T - 1, T - 2], HOSTILE, top_n=T, prompt=TEXT)
sampling.error = TEXT
sampling
```

```{{code-cell}} ipython3
import sys
import time

for i in range(3):  # a progress bar redraws its line: separate messages, one per drawing
    sys.stderr.write(f"\\rdrawing {{i}} of the bar")
    sys.stderr.flush()
    time.sleep(0.2)
sys.stderr.write("\\n")
```
'''
WIDGETS = ["tfw-tokens", "tfw-bpe", "tfw-attention", "tfw-positions", "tfw-rope",
           "tfw-sampling"]


def rooted(value: object, key: str = "") -> object:
    """The repository's configuration with every path it names made absolute (exclusion
    patterns stay relative), so that it works from another folder."""
    if isinstance(value, dict):
        return {k: rooted(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [rooted(v, key) for v in value]
    if isinstance(value, str) and value and key != "exclude_patterns" and (ROOT / value).exists():
        return str(ROOT / value)
    return value


@pytest.fixture(scope="module")
def hostile_book(tmp_path_factory) -> Path:
    """A one-chapter book with the repository's configuration, built as `make book` does."""
    folder = tmp_path_factory.mktemp("hostile_book")
    config = rooted(yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8")))
    # the extension under test, and the front-end scripts in their order (no sorting)
    assert config["sphinx"]["local_extensions"]["tfbook_site"] == str(SITE_EXTENSION.parent)
    config_text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
    (folder / "_config.yml").write_text(config_text, encoding="utf-8")
    (folder / "_toc.yml").write_text("format: jb-book\nroot: hostile\n", encoding="utf-8")
    (folder / "hostile.md").write_text(CHAPTER.format(hostile=HOSTILE), encoding="utf-8")
    if not (ASSETS / "require.min.js").exists():
        pytest.fail("the front-end files are missing: run `make vendor` (make test does it)")
    command = [sys.executable, str(ROOT / "scripts" / "build_book.py"), "build", "--all", "-W",
               "-n", "--keep-going", str(folder)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=folder)
    if result.returncode != 0:
        pytest.fail(f"the book build failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}")
    return folder / "_build"


def saved_state(build: Path) -> dict:
    """The widget state the executed chapter saved (what the page must hand to JSON.parse)."""
    notebook = json.loads((build / "jupyter_execute" / "hostile.ipynb").read_text("utf-8"))
    return notebook["metadata"]["widgets"][site.WIDGET_STATE_TYPE]


def slide(root, label: str, value: int) -> None:
    """Move the range input named `label` to `value` as a user would (an input event)."""
    root.locator(f"input[type=range][aria-label='{label}']").evaluate(
        "(s, v) => { s.value = String(v); s.dispatchEvent(new Event('input')); }", value)


def texts(root, selector: str) -> list[str]:
    return root.locator(selector).evaluate_all("(nodes) => nodes.map((n) => n.textContent)")


STATE_SCRIPT = 'script[type="application/vnd.jupyter.widget-state+json"]'


@pytest.fixture(scope="module")
def hostile_page(browser, hostile_book: Path):
    """The built chapter in Chromium, once all its widgets are drawn (or after 60 s, for the
    tests to say what is missing); yields (page, PageLog)."""
    with serve(hostile_book / "html") as base_url:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        log = watch(page, base_url)
        page.goto(base_url + "hostile.html")  # waits for "load": every <img> has failed by then
        try:
            page.wait_for_function(
                f"document.querySelectorAll('.tfw').length === {len(WIDGETS)}", timeout=60000)
        except PlaywrightTimeoutError:
            pass
        yield page, log
        page.close()


def test_built_html_has_no_angle_bracket_in_the_state(hostile_book: Path) -> None:
    html = (hostile_book / "html" / "hostile.html").read_text(encoding="utf-8")
    states = re.findall(r'<script type="application/vnd\.jupyter\.widget-state\+json">'
                        r'(.*?)</script>', html, flags=re.S)
    assert len(states) == 1
    assert "<" not in states[0]


def test_built_page_shows_a_progress_bar_as_a_terminal_does(hostile_book: Path) -> None:
    html = (hostile_book / "html" / "hostile.html").read_text(encoding="utf-8")
    assert "drawing 2 of the bar" in html
    assert "drawing 0 of the bar" not in html and "drawing 1 of the bar" not in html


def test_built_page_runs_nothing_from_the_state(hostile_page, hostile_book: Path) -> None:
    page, log = hostile_page
    injected = page.evaluate("() => document.querySelectorAll('img[src=x], [onerror]').length")
    assert (injected, log.dialogs) == (0, []), "the widget state injected elements or ran code"
    assert page.locator(STATE_SCRIPT).count() == 1
    # what the widget manager reads is exactly the state the executed chapter saved
    state = page.evaluate(f"() => JSON.parse(document.querySelector('{STATE_SCRIPT}').text)")
    assert state == saved_state(hostile_book)
    assert not log.page_errors, f"the page raised in JavaScript: {log.page_errors}"
    assert not log.foreign_requests, f"the page asked other hosts: {log.foreign_requests}"


@pytest.mark.parametrize("name", WIDGETS)
def test_built_page_draws_every_widget(hostile_page, name: str) -> None:
    page, _ = hostile_page
    assert page.locator(f".tfw.{name}").count() == 1, f"{name} was not drawn"


def test_built_page_shows_hostile_text_literally(hostile_page) -> None:
    page, _ = hostile_page
    shown = {name: page.locator(f".tfw.{name}") for name in WIDGETS}
    for name, root in shown.items():  # every widget shows its error text as it is
        assert TEXT in root.text_content(), f"{name} does not show the error text"

    root = shown["tfw-tokens"]
    assert visible(TEXT) in root.text_content()
    assert [t.rsplit(" (", 1)[0] for t in texts(root, ".tfw-title")] == HOSTILE  # names

    root = shown["tfw-bpe"]
    assert root.locator("textarea").input_value() == ""  # empty: retrain on the same text
    assert visible(HOSTILE[0]) in root.locator(".tfw-tokenline").first.text_content()
    examples = root.evaluate("""(root) => {  // step through every merge, as the slider does
      const slider = root.querySelector("input[type=range][aria-label='merges applied']");
      let shown = "";
      for (let k = 1; k <= Number(slider.max); k++) {
        slider.value = String(k);
        slider.dispatchEvent(new Event("input"));
        shown += root.querySelector(".tfw-details").textContent;
      }
      return shown;
    }""")
    for h in HOSTILE:
        assert f'"{visible(h + chr(10))}"' in examples, f"BPE never showed the line {h!r}"

    root = shown["tfw-attention"]
    assert texts(root, "option") == [HOSTILE[0], TEXT]
    assert root.locator("input[type=text]").get_attribute("placeholder") == TEXT
    strips = root.locator(".tfw-strip")
    assert texts(strips.nth(0), ".tfw-token") == [visible(h) for h in HOSTILE]
    root.locator("select").select_option("1")
    page.wait_for_function("(s) => s.children.length === 3",
                           arg=strips.nth(0).element_handle())
    assert texts(strips.nth(0), ".tfw-token") == [visible(h) for h in HOSTILE[:3]]
    assert texts(strips.nth(1), ".tfw-token") == [visible(h) for h in HOSTILE]

    root = shown["tfw-positions"]
    for p, h in enumerate(HOSTILE):
        slide(root, "position p", p)
        title = root.locator("div").first.text_content()
        assert title.endswith(f"selected p = {p} ({visible(h)})"), title

    root = shown["tfw-sampling"]
    assert root.locator("textarea").input_value() == TEXT
    labels = root.locator(".tfw-label")
    assert sorted(labels.evaluate_all("(n) => n.map((e) => e.title)")) == sorted(HOSTILE)
    context = texts(root, ".tfw-context .tfw-token")
    assert context[:len(HOSTILE)] == [visible(h) for h in HOSTILE]
