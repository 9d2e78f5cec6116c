"""Headless Chromium for the dashboard's tests (Debian's ``chromium`` and
``chromium-driver``, driven by selenium): a browser that logs in through
the login page, and one that reaches nothing but loopback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

# Every request that is not to 127.0.0.1 fails: no name resolves, and the
# proxy that everything else would go through is a port nothing listens on.
OFFLINE = ('--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1',
           "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=127.0.0.1")


def chromium(offline: bool = False) -> WebDriver:
    """A headless Chromium; skips the test when Chromium is not installed."""
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--disable-gpu", *(OFFLINE if offline else ())):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=options)


def log_in(browser: WebDriver, base: str, token: str, page: str = "/ui/cluster") -> None:
    browser.get(f"{base}{page}")
    assert "/ui/login" in browser.current_url, browser.current_url
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.ID, "login").click()
    WebDriverWait(browser, 10).until(lambda b: "/ui/login" not in b.current_url)


def shoot(browser: WebDriver, folder: Path, name: str) -> Path:
    """A screenshot of the page (a test artefact under pytest's tmp dir)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    browser.save_screenshot(str(path))
    return path
