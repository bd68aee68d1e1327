"""Open a page in headless Chromium (Debian's chromium and chromium-driver) at a given width and say what a
reader would see: horizontal overflow of the page and of its tables, console errors, the title."""

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

_has_chromium = pytest.mark.skipif(not shutil.which("chromedriver"),
                                   reason="needs Debian's chromium and chromium-driver")


def needs_chromium(test):
    """A test that drives headless Chromium: skipped without it, and in the slow tier (a browser start)."""
    return pytest.mark.slow(_has_chromium(test))


@dataclass
class PageCheck:
    title: str
    page_overflow: int  # px the page is wider than the window (0: no horizontal scrolling)
    wide_tables: list  # [section id, table scrollWidth, clientWidth] of tables that overflow
    errors: list  # console messages of level SEVERE
    text: str


def open_page(path: Path, width: int = 1400, height: int = 1000, script: str | None = None) -> PageCheck:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(Path(path).as_uri())
        root = driver.execute_script("return [document.documentElement.scrollWidth, "
                                     "document.documentElement.clientWidth]")
        tables = driver.execute_script(
            "const w = document.documentElement.clientWidth;"
            "return Array.from(document.querySelectorAll('table')).filter(t => t.scrollWidth > t.clientWidth + 1"
            " || t.getBoundingClientRect().right > w + 1).map(t => [t.closest('section') ? "
            "t.closest('section').id : '', t.scrollWidth, t.clientWidth])")
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        return PageCheck(driver.title, root[0] - root[1], tables, errors,
                         driver.execute_script("return document.body.innerText"))
    finally:
        driver.quit()
