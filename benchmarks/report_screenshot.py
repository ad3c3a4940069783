"""The HTML report of a planned MLP training step, and a screenshot of it for the README.

Plans ``relu(x @ w1) @ w2`` (batch 256, hidden 1024, ffn 4096) with its backward pass on
data=2,model=4 (8 simulated CPU devices, profile cpu-2core), verifies every plan on the
devices, writes the report and takes a screenshot of its top (the header, the plans compared
and the first ops) in the system's headless Chromium:

    .venv/bin/python benchmarks/report_screenshot.py [--repeat 3] [--height 1400] [--hover 3] \
        [--html benchmarks/report_mlp_train.html] [--png benchmarks/report_mlp_train.png]

Needs ``apt-get install chromium chromium-driver`` and ``pip install selenium``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import shardwise

CHROMIUM = "/usr/bin/chromium"
DRIVER = "/usr/bin/chromedriver"
WIDTH = 1400


def report(repeat: int) -> dict[str, Any]:
    """The plan (verified) and its op-by-op report, as JSON."""
    from shardwise._program.models import model

    fn, args = model("mlp", batch=256, hidden=1024, ffn=4096, train=True)
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile="cpu-2core", train=True)
    verified = plan.verify(repeat=repeat)
    return {"plan": verified.to_json(), "report": verified.report().to_json()}


def screenshot(page: Path, png: Path, height: int, hover: int) -> None:
    """``page`` opened from disk in headless Chromium, the top ``height`` pixels saved (with
    device ``hover`` highlighted and what it holds listed, unless it is negative)."""
    from selenium import webdriver
    from selenium.webdriver import ActionChains
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory() as user_data:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={user_data}",
            f"--window-size={WIDTH},{height}",
        ):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver: Any = webdriver.Chrome(service=Service(DRIVER), options=options)
        try:
            metrics = {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False}
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
            driver.get(page.resolve().as_uri())
            driver.find_element("id", "info")
            if hover >= 0:
                device = driver.find_elements("css selector", f'.device[data-device="{hover}"]')
                ActionChains(driver).move_to_element(device[1]).perform()
            errors = [m for m in driver.get_log("browser") if m["level"] == "SEVERE"]
            if errors:
                raise SystemExit(f"the page logged errors: {errors}")
            png.write_bytes(driver.get_screenshot_as_png())
        finally:
            driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per plan to verify")
    parser.add_argument("--height", type=int, default=1400, help="screenshot height, pixels")
    parser.add_argument("--hover", type=int, default=3, help="device to highlight; -1: none")
    parser.add_argument("--html", type=Path, default=Path("benchmarks/report_mlp_train.html"))
    parser.add_argument("--png", type=Path, default=Path("benchmarks/report_mlp_train.png"))
    args = parser.parse_args()
    shardwise.use_cpu_devices(8)
    from shardwise.render.report import program_html

    start = time.perf_counter()
    data = report(args.repeat)
    page = program_html(data)
    args.html.write_text(page, encoding="utf-8")
    screenshot(args.html, args.png, args.height, args.hover)
    plans = data["plan"]["plans"]
    print(
        json.dumps(
            {
                "html": str(args.html),
                "html_bytes": len(page.encode()),
                "png": str(args.png),
                "plans": len(plans),
                "seconds": round(time.perf_counter() - start, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
