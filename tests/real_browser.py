"""Headless Chromium for the browser tests (the explorer page, the live page): one way to start
it, and one reason to skip where it is absent (`make browser` installs it)."""

from __future__ import annotations

import shutil

import pytest

NEEDS = "needs Chromium and chromedriver (make browser installs them)"
CHROMEDRIVER = shutil.which("chromedriver") or shutil.which("chromium.chromedriver")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MISSING = not (CHROMEDRIVER and CHROMIUM)


def chromium(*extra_args: str):
    """A headless Chromium under WebDriver, its console log kept; quit it when done."""
    pytest.importorskip("selenium", reason=NEEDS)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--window-size=1280,1000",
        "--autoplay-policy=no-user-gesture-required",
        "--mute-audio",
        *extra_args,
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def severe_errors(driver) -> list[dict]:
    """The console's errors since the last call."""
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
