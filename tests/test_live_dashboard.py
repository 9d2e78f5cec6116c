"""The dashboard in a real browser (headless Chromium) against the real
stack (tests/livestack.py: nats-server, every service, an emulated
cluster): a tenant logs in and sees only its own jobs; a job submitted
with the CLI appears, gets a reason and a forecast, runs and finishes on
the page without a reload; the admin sees the cluster map change when a
node is drained; ``/docs`` renders with every non-loopback request
blocked. Screenshots of each page are left under the test's tmp dir."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.browser import chromium, log_in, shoot
from tests.livestack import LiveStack, until
from tests.test_live_holds import ALICE, BOB, NEVER, SHORT, api, hops, spec, stack

__all__ = ["api", "stack"]  # fixtures: one 4-GPU server, tenants alice and bob


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    b = chromium()
    try:
        yield b
    finally:
        b.quit()


def text(browser: WebDriver, css: str) -> str:
    """The text of the first element ``css`` selects ('' if none), read in the
    page at once (a live refresh may replace an element between two calls)."""
    found: str = browser.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : ''", css)
    return found


def wait(browser: WebDriver, what: str, timeout: float, check: object) -> None:
    WebDriverWait(browser, timeout, 0.2).until(
        lambda b: check(b), message=f"{what}: not within {timeout:g} s")  # type: ignore[operator]


def test_docs_render_with_no_network(stack: LiveStack, tmp_path: Path) -> None:
    browser = chromium(offline=True)
    try:
        browser.get(f"{stack.config.gateway_url}/docs")
        wait(browser, "swagger-ui rendered the schema", 20,
             lambda b: "Hops gateway" in text(b, ".swagger-ui .info"))
        assert browser.find_elements(By.CSS_SELECTOR, ".swagger-ui .opblock")
        shoot(browser, tmp_path, "docs")
    finally:
        browser.quit()


def test_pages_need_a_login_and_the_api_still_answers_401(stack: LiveStack,
                                                          api: httpx.Client) -> None:
    r = api.get("/ui/queue", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/ui/login?next=%2Fui%2Fqueue")
    assert api.get("/jobs").status_code == 401
    assert api.get("/", follow_redirects=False).headers["location"] == "/ui/cluster"
    bad = api.post("/ui/login", content="token=nope&next=/ui/jobs",
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert bad.status_code == 401 and "not valid" in bad.text
    good = api.post("/ui/login", content="token=alice-token&next=//evil.example/",
                    headers={"Content-Type": "application/x-www-form-urlencoded"},
                    follow_redirects=False)
    assert good.headers["location"] == "/ui/cluster"
    cookie = good.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    # the cookie authenticates the API as the bearer header does, as alice
    api.cookies.set("hops_token", "alice-token")
    try:
        assert api.get("/jobs").status_code == 200
        assert api.get("/tenants", params={"tenant": "bob"}).status_code == 403
    finally:
        api.cookies.clear()


def test_a_tenant_follows_its_job_from_submission_to_its_end(
        stack: LiveStack, api: httpx.Client, browser: WebDriver, tmp_path: Path) -> None:
    base = stack.config.gateway_url
    log_in(browser, base, "alice-token", "/ui/jobs")
    browser.execute_script("window.stayed = 1")  # gone if the page reloads
    opened(browser)
    # alice's own job holds the whole server, so that the next one waits
    assert api.post("/jobs", json=spec("blocker", NEVER), headers=ALICE).status_code == 201
    until(lambda: stack.phase("alice/blocker") == "running", "the blocker running", 60,
          stack.logs)
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps([{**spec("watched", SHORT), "requirements": [1]}]))
    done = hops(stack, "submit", str(jobs), token="alice-token")
    assert done.exit_code == 0, done.output
    wait(browser, "the new job's row", 30,
         lambda b: b.find_elements(By.CSS_SELECTOR, 'tr[data-id="watched"]'))
    assert browser.execute_script("return window.stayed") == 1, "the page reloaded"
    shoot(browser, tmp_path, "jobs")
    link = text(browser, 'tr[data-id="watched"] a')
    assert link == "watched", link
    browser.get(f"{base}/ui/queue")
    wait(browser, "the waiting job in the queue with a reason", 60,
         lambda b: text(b, 'tr[data-id="watched"] .why') not in ("", "None"))
    assert "blocker" not in text(browser, "#rows")  # it runs: not in the queue
    shoot(browser, tmp_path, "queue")
    browser.get(f"{base}/ui/jobs/watched")
    wait(browser, "the job page", 10, lambda b: b.find_elements(By.ID, "phase"))
    browser.execute_script("window.stayed = 1")
    opened(browser)
    wait(browser, "a reason and a forecast", 60,
         lambda b: text(b, "#why") not in ("", "-") and text(b, "#start") not in ("", "-"))
    shoot(browser, tmp_path, "job")
    assert api.delete("/jobs/blocker", headers=ALICE).status_code == 200
    seen: set[str] = set()

    def progressed(b: WebDriver) -> bool:
        seen.add(text(b, "#phase"))
        return "finished" in seen

    wait(browser, "the job finished on the page", 120, progressed)
    assert browser.execute_script("return window.stayed") == 1, "the page reloaded"
    assert "running" in seen or stack.bus_().job_events("alice/watched", "job_started"), seen
    wait(browser, "the log ended", 30, lambda b: b.execute_script(
        "return document.getElementById('logs').dataset.ended === '1'"))
    # the emulated job's training log, to its last line, followed on the page
    log = text(browser, "#logs")
    assert "[emulated] training" in log and "[emulated] finished at" in log, log
    only_own(stack, api, browser)


def opened(browser: WebDriver) -> None:
    wait(browser, "the event stream open", 10,
         lambda b: b.execute_script("return document.body.dataset.live === '1'"))


def only_own(stack: LiveStack, api: httpx.Client, browser: WebDriver) -> None:
    """Bob's job never reaches alice's jobs page, neither listed nor by an
    event, while her own next job does."""
    browser.get(f"{stack.config.gateway_url}/ui/jobs")
    opened(browser)
    short = {**spec("bobs-job", SHORT), "requirements": [1]}
    assert api.post("/jobs", json=short, headers=BOB).status_code == 201
    until(lambda: stack.record("bob/bobs-job"), "bob's job stored", 15, stack.logs)
    after = {**spec("after", SHORT), "requirements": [1]}
    assert api.post("/jobs", json=after, headers=ALICE).status_code == 201
    wait(browser, "alice's next job's row", 30,
         lambda b: b.find_elements(By.CSS_SELECTOR, 'tr[data-id="after"]'))
    assert not browser.find_elements(By.CSS_SELECTOR, 'tr[data-id="bobs-job"]')
    assert "bob" not in text(browser, "#rows")
    browser.refresh()
    assert "bobs-job" not in browser.page_source


def test_the_admin_sees_a_drained_node_on_the_cluster_map(
        stack: LiveStack, api: httpx.Client, browser: WebDriver, tmp_path: Path) -> None:
    log_in(browser, stack.config.gateway_url, stack.admin_token)
    wait(browser, "the server row", 10, lambda b: text(b, 'tr[data-id="rtx-0"] .state'))
    assert text(browser, 'tr[data-id="rtx-0"] .state') == "alive"
    browser.execute_script("window.stayed = 1")
    opened(browser)
    r = api.post("/nodes/rtx-0/drain", headers=stack.headers)
    assert r.status_code == 200, r.text
    try:
        wait(browser, "the node shown drained", 30,
             lambda b: text(b, 'tr[data-id="rtx-0"] .state') == "drained")
        assert browser.execute_script("return window.stayed") == 1
        shoot(browser, tmp_path, "cluster")
        for page in ("tenants",):
            browser.get(f"{stack.config.gateway_url}/ui/{page}")
            wait(browser, page, 10, lambda b: b.find_elements(By.TAG_NAME, "h1"))
            shoot(browser, tmp_path, page)
    finally:
        assert api.post("/nodes/rtx-0/undrain", headers=stack.headers).status_code == 200
