"""The HTML reports in a real headless Chromium (the system's browser and driver, driven by
Selenium): no console errors, every array on all 8 devices, hovering or clicking a device
highlights it everywhere and says what it holds, clicking a collective says why, and the page
draws something (the screenshot is not blank); a notebook's view of a report, put into a page
with styles of its own, leaves that page's styles as they were.

Every look-up waits for its condition (``WebDriverWait(...).until``) rather than for a time:
on a loaded 2-core machine the browser may take seconds to lay out a page or run its script."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shardwise
from shardwise._program.models import model
from shardwise.render.report import program_html

CHROMIUM = Path("/usr/bin/chromium")
DRIVER = Path("/usr/bin/chromedriver")
INSTALL = "install the system browser and driver: apt-get install chromium chromium-driver"
MESH = "data=2,model=4"
DEVICES = 8
WAIT_S = 120
"""How long any condition may take to come true (page load, script run, a highlight)."""


def _options(user_data: str) -> Any:
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={user_data}",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return options


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip(f"selenium is not importable: pip install selenium, and {INSTALL}")
    for path in (CHROMIUM, DRIVER):
        if not path.exists():
            pytest.skip(f"{path} is missing: {INSTALL}")
    with tempfile.TemporaryDirectory() as user_data:
        try:
            browser = webdriver.Chrome(service=Service(str(DRIVER)), options=_options(user_data))
        except WebDriverException:  # a first start on a busy machine can miss its deadline
            browser = webdriver.Chrome(service=Service(str(DRIVER)), options=_options(user_data))
        browser.set_page_load_timeout(WAIT_S)
        browser.set_script_timeout(WAIT_S)
        try:
            yield browser
        finally:
            browser.quit()


def _wait(driver: Any, condition: Any, what: str) -> Any:
    """``condition(driver)``'s first truthy value, waiting up to :data:`WAIT_S` for it."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(condition, message=f"waited for {what}")


def _info(driver: Any) -> str:
    return str(_wait(driver, lambda d: d.find_element("css selector", ".info"), ".info").text)


def _plan(name: str, **sizes: Any) -> Any:
    fn, args = model(name, train=True, **sizes)
    return shardwise.plan(fn, *args, mesh=MESH, profile="cpu-2core", train=True, top=1)


def _load(driver: Any, page: str, path: Path) -> list[dict[str, Any]]:
    """Open ``page`` from disk; the console messages it logged."""
    path.write_text(page, encoding="utf-8")
    driver.get_log("browser")
    driver.get(path.as_uri())
    _wait(driver, lambda d: d.execute_script("return document.readyState") == "complete", "load")
    _wait(driver, lambda d: d.find_elements("css selector", ".info"), "the report's .info")
    return list(driver.get_log("browser"))


@pytest.fixture(scope="module")
def mlp() -> dict[str, Any]:
    """The MLP training step, shown under its plan with the most collectives."""
    p = _plan("mlp", batch=64, hidden=32, ffn=64)
    reports = [p.report(plan["name"]).to_json() for plan in p.to_json()["plans"]]
    report = max(reports, key=lambda r: sum(len(row["collectives"]) for row in r["rows"]))
    return {"plan": p.to_json(), "report": report}


def _held(rect: Any) -> str:
    title = rect.find_element("tag name", "title").get_attribute("textContent")
    return str(title.split(": ", 1)[1])


def _check_highlight(driver: Any, device: str) -> None:
    arrays = driver.find_elements("css selector", ".array")
    _wait(
        driver,
        lambda d: (
            [r.get_attribute("data-device") for r in d.find_elements("css selector", ".device.hl")]
            == [device] * len(arrays)
        ),
        f"device {device} lit in every array",
    )
    info = _info(driver)
    for array in arrays:
        lit = array.find_elements("css selector", ".device.hl")
        assert [r.get_attribute("data-device") for r in lit] == [device]
        assert _held(lit[0]) in info
    assert len(driver.find_elements("css selector", ".device.hl")) == len(arrays)


def test_the_mlp_report_works_in_chromium(driver: Any, mlp: dict[str, Any], tmp_path: Path) -> None:
    from selenium.webdriver import ActionChains

    logs = _load(driver, program_html(mlp), tmp_path / "mlp.html")
    assert [m for m in logs if m["level"] == "SEVERE"] == []
    arrays = driver.find_elements("css selector", ".array")
    rows = mlp["report"]["rows"]
    assert len(arrays) == sum(len(r["inputs"]) + 1 for r in rows)
    for array in arrays:
        assert len(array.find_elements("css selector", ".device")) == DEVICES

    hovered = arrays[0].find_elements("css selector", ".device")[5]
    ActionChains(driver).move_to_element(hovered).perform()
    _check_highlight(driver, "5")
    assert "device 5" in _info(driver)

    clicked = arrays[-1].find_elements("css selector", ".device")[2]
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", clicked)
    ActionChains(driver).move_to_element(clicked).click().perform()
    _check_highlight(driver, "2")

    buttons = driver.find_elements("css selector", ".coll")
    assert len(buttons) == sum(len(r["collectives"]) for r in rows) > 0
    for button in (buttons[0], buttons[-1]):
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
        button.click()
        why = button.get_attribute("data-why")
        _wait(driver, lambda d, why=why: why in _info(d), "the collective's cause in .info")
        assert driver.find_elements("css selector", ".coll.hl") == [button]
    assert [m for m in driver.get_log("browser") if m["level"] == "SEVERE"] == []


def test_the_screenshot_is_not_blank(driver: Any, mlp: dict[str, Any], tmp_path: Path) -> None:
    import matplotlib.image
    import numpy as np

    _load(driver, program_html(mlp), tmp_path / "mlp.html")
    shot = tmp_path / "mlp.png"
    shot.write_bytes(driver.get_screenshot_as_png())
    pixels = np.asarray(matplotlib.image.imread(str(shot)))
    assert pixels.shape[0] >= 500 and pixels.shape[1] >= 1000
    colours = np.unique((pixels[..., :3] * 255).round().astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 50
    assert pixels[..., :3].std() > 0.05


def test_a_two_layer_transformer_report_loads_cleanly(driver: Any, tmp_path: Path) -> None:
    p = _plan("transformer", batch=4, seq=8, hidden=32, ffn=64, heads=4, layers=2)
    page = program_html({"plan": p.to_json(), "report": p.report().to_json()})
    assert len(page.encode()) < 2_000_000
    logs = _load(driver, page, tmp_path / "transformer.html")
    assert [m for m in logs if m["level"] == "SEVERE"] == []
    arrays = driver.find_elements("css selector", ".array")
    assert len(arrays) == sum(len(r["inputs"]) + 1 for r in p.report().to_json()["rows"])
    counts = driver.execute_script(
        "return Array.from(document.querySelectorAll('.array'), "
        "a => a.querySelectorAll('.device').length)"
    )
    assert set(counts) == {DEVICES}


HOST = """<!DOCTYPE html><html><head><meta charset="utf-8"><style>
body{background:rgb(255,255,255);margin:8px;font:17px serif;color:rgb(20,20,20)}
table{border-collapse:separate;font-family:monospace}
td{padding:1px}
.note{color:rgb(0,0,128)}
</style></head><body><p class="note" id="before">before</p>
<table id="theirs"><tr><td id="cell">their cell</td></tr></table>
<div id="slot"></div><p class="note" id="after">after</p></body></html>"""
"""A page with styles of its own (a docs site, a notebook), with a slot for a report."""

STYLES = """
const pick = (sel, props) => {
  const style = getComputedStyle(document.querySelector(sel));
  return props.map(p => sel + ' ' + p + ': ' + style.getPropertyValue(p));
};
return [].concat(
  pick('body', ['background-color', 'margin-top', 'font-family', 'font-size', 'color']),
  pick('#theirs', ['border-collapse', 'font-family', 'box-sizing']),
  pick('#cell', ['padding-top', 'border-bottom-style', 'text-transform', 'box-sizing']),
  pick('#before', ['color', 'font-size', 'margin-top']),
  pick('#after', ['color', 'font-family']));
"""
"""The computed styles of the host page's own elements, as ``selector property: value``."""

INSERT = """
const slot = document.getElementById('slot');
for (const html of arguments[0]) {
  // as a notebook shows an output: parsed in place, its script run on insertion
  slot.appendChild(document.createRange().createContextualFragment(html));
}
"""


def test_a_notebook_view_leaves_the_page_around_it_as_it_was(
    driver: Any, mlp: dict[str, Any], tmp_path: Path
) -> None:
    explained = shardwise.explain_einsum(
        "nd,nd->n", [(16, 8)] * 2, mesh=MESH, in_specs=["data,model"] * 2, out_specs="data"
    )
    views = [explained._repr_html_(), program_html(mlp, page=False)]
    path = tmp_path / "host.html"
    path.write_text(HOST, encoding="utf-8")
    driver.get(path.as_uri())
    _wait(driver, lambda d: d.execute_script("return document.readyState") == "complete", "load")
    before = driver.execute_script(STYLES)
    assert "body background-color: rgb(255, 255, 255)" in before

    driver.execute_script(INSERT, views)
    roots = _wait(
        driver,
        lambda d: len(found := d.find_elements("css selector", ".shardwise-report")) == 2 and found,
        "both reports in the page",
    )
    assert driver.execute_script(STYLES) == before
    # the reports are styled (their own grey), and each one's script works inside it alone
    for root in roots:
        colour = driver.execute_script(
            "return getComputedStyle(arguments[0]).backgroundColor", root
        )
        assert colour == "rgb(244, 245, 247)"
    first, second = (root.find_element("css selector", ".info") for root in roots)
    hint = first.text
    device = roots[1].find_elements("css selector", ".device")[3]
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", device)
    from selenium.webdriver import ActionChains

    ActionChains(driver).move_to_element(device).perform()
    _wait(driver, lambda d: "device 3" in second.text, "the second report's .info")
    assert first.text == hint
    assert roots[0].find_elements("css selector", ".device.hl") == []
    assert [m for m in driver.get_log("browser") if m["level"] == "SEVERE"] == []
