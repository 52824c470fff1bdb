"""Debian's headless Chromium driven by Playwright: the UI browser test and the README's screenshot.

Never a downloaded browser: Playwright launches ``/usr/bin/chromium`` (``scripts/install-browser.sh``
installs it) with flags that keep it off the network (this machine reaches package registries only).

    python -m devtools.browser --url http://127.0.0.1:8080 --user admin --password admin \\
        --out docs/federation-page.png [--dark] [--job JOB_ID]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

# No background networking, component updates, sync or QUIC: Chromium would otherwise keep trying
# to reach Google's hosts, which this machine cannot (and must not) reach.
CHROMIUM_ARGS = [
    "--no-sandbox",  # runs as root in CI
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
PAGE = "plugin/iris-federation"


def chromium_path() -> str | None:
    for candidate in (os.environ.get("IRIS_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium"):
        if candidate and Path(candidate).exists():
            return candidate
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium browser (Playwright ``Browser``)."""
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    if path is None:
        raise RuntimeError("Chromium is not installed: run scripts/install-browser.sh (Debian's chromium package)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def sign_in(page: Any, base_url: str, user: str, password: str) -> None:
    """Sign in through Airflow's own login form, so the UI holds its session cookie as for a person."""
    page.goto(f"{base_url}/auth/login?next={quote(base_url + '/', safe='')}")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.keyboard.press("Enter")
    page.wait_for_url(lambda url: "/auth/login" not in url, timeout=30_000)


def page_url(base_url: str, job_id: str | None = None) -> str:
    return f"{base_url}/{PAGE}" + (f"?job={quote(job_id, safe='')}" if job_id else "")


def screenshot(
    base_url: str, user: str, password: str, out: Path, *, dark: bool = False, job_id: str | None = None
) -> None:
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1440, "height": 900}, color_scheme="dark" if dark else "light")
        page = context.new_page()
        sign_in(page, base_url, user, password)
        page.goto(page_url(base_url, job_id))
        page.get_by_test_id("jobs-table").locator("tbody tr").first.wait_for(timeout=30_000)
        page.locator("[role=meter]").first.wait_for(timeout=30_000)
        if job_id:
            page.get_by_test_id("explanation").wait_for(timeout=30_000)
        page.wait_for_timeout(500)  # let the drawer's opening animation finish
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out), full_page=not job_id)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Screenshot the Federation page of a running deployment.")
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--user", default="admin")
    parser.add_argument("--password", default="admin")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dark", action="store_true")
    parser.add_argument("--job", help="open this job's detail")
    args = parser.parse_args(argv)
    screenshot(args.url.rstrip("/"), args.user, args.password, args.out, dark=args.dark, job_id=args.job)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
