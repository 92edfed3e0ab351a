"""The web console in a real browser (Debian's headless chromium through its chromedriver,
driven by Selenium) against a live stack: a null worker that takes 50 ms a step, so an answer
streams for a while, the real tokenizer, API keys, the internal token, and the gateway's own
trace receiver (as `make run` sets it up). A chat streams an answer with its numbers; Esc stops
a long one and the scheduler frees its blocks; the request's timeline holds spans from the
gateway, tokenizer, scheduler and worker; the stack panel shows the running request. Desktop
and phone-sized windows, keyboard only where a user would type, no error in the browser's
console. A screenshot of each view is kept under the test's tmp dir (printed)."""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from services.stack import Stack
from tests.e2e.conftest import free_ports, loopback_config, start_stack

pytestmark = pytest.mark.e2e
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
KEY = "console-test-key"
SERVICES = ("gateway", "tokenizer", "scheduler", "worker")

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the test extra) missing")
if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
    pytest.skip(
        f"{CHROMIUM} or {CHROMEDRIVER} missing (Debian's chromium and chromium-driver, which "
        ".ci/run installs with apt-get)",
        allow_module_level=True,
    )
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    (receiver,) = free_ports(1)
    config = loopback_config(
        null_worker=True,
        worker_args=["--null-step-seconds", "0.05"],
        # A small step budget splits the prompt into prefill chunks.
        scheduler_args=["--max-num-batched-tokens", "16"],
        log_dir=Path(tmp_path_factory.mktemp("console-logs")),
        redis="off",
    )
    config.env.update(
        {
            "LAYERSERVE_API_KEYS": KEY,
            "LAYERSERVE_INTERNAL_TOKEN": secrets.token_hex(16),
            "LAYERSERVE_TRACE_RECEIVER": f"127.0.0.1:{receiver}",
            "LAYERSERVE_SCHEDULER_ADDRESS": f"127.0.0.1:{config.scheduler_port}",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "",
        }
    )
    stack = start_stack(config)
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    driver.set_window_size(1280, 900)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("console-screenshots")
    print(f"console screenshots in {folder}")
    return folder


def wait_for(what: Callable[[], object], timeout: float = 20.0, why: str = "") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = what()
        except Exception:  # an element replaced mid-read: try again
            found = None
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {why or what}")


def stack_state(stack: Stack) -> dict:
    headers = {"Authorization": f"Bearer {KEY}"}
    return httpx.get(f"{stack.http_url}/console/api/stack", headers=headers, timeout=5).json()


def text(driver, selector: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, selector).text


def send(driver, prompt: str, max_tokens: int) -> None:
    field = driver.find_element(By.ID, "max-tokens")
    field.clear()
    field.send_keys(str(max_tokens))
    driver.find_element(By.ID, "prompt").send_keys(prompt, Keys.ENTER)


def test_chat_stop_timeline_and_stack_in_a_real_browser(stack, browser, shots):
    driver = browser
    driver.get(stack.http_url + "/")
    # The stack has keys: the page asks for one and keeps it for this tab only.
    wait_for(lambda: driver.find_element(By.ID, "key-input").is_displayed(), why="key form")
    driver.find_element(By.ID, "key-input").send_keys(KEY, Keys.ENTER)
    wait_for(lambda: text(driver, "#model"), why="the model list")
    assert driver.execute_script("return localStorage.length") == 0
    assert driver.execute_script(f"return sessionStorage.getItem('{'layerserve.key'}')") == KEY

    # A chat streams an answer, with its usage, TTFT and tokens/s.
    send(driver, "Describe the quokka in one short line.", max_tokens=12)
    answer = "#conversation li:nth-child(2)"
    wait_for(lambda: driver.find_element(By.CSS_SELECTOR, answer).get_attribute("data-outcome"))
    assert driver.find_element(By.CSS_SELECTOR, answer).get_attribute("data-outcome") == "length"
    stats = text(driver, answer + " .stats")
    assert "TTFT" in stats and "completion 12" in stats and "tok/s" in stats, stats
    assert text(driver, answer + " .content")
    driver.save_screenshot(str(shots / "chat.png"))

    # A long answer runs; the stack panel shows it running; Esc stops it upstream.
    send(driver, "Now tell me everything about quokkas.", max_tokens=500)
    long_answer = "#conversation li:nth-child(4)"
    wait_for(lambda: text(driver, long_answer + " .content"), why="the long answer streaming")
    driver.find_element(By.ID, "tab-stack").click()
    wait_for(lambda: text(driver, "#stack-running") == "1", why="the running request shown")
    stats = driver.find_element(By.CSS_SELECTOR, long_answer + " .stats")  # on a hidden tab
    request_id = stats.get_attribute("textContent").split(" · ")[-1]
    assert request_id.startswith("chatcmpl-")
    wait_for(lambda: request_id in text(driver, "#stack-yours tbody"), why="it, by its id")
    assert "127.0.0.1" in text(driver, "#stack-workers tbody")
    driver.save_screenshot(str(shots / "stack.png"))
    driver.find_element(By.ID, "tab-chat").click()
    driver.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
    wait_for(
        lambda: (
            driver.find_element(By.CSS_SELECTOR, long_answer).get_attribute("data-outcome")
            == "stopped"
        ),
        why="the stop",
    )
    freed = wait_for(
        lambda: (
            (s := stack_state(stack))["totals"]["running"] == 0
            and s["totals"]["kv_used_blocks"] == 0
        ),
        why="the scheduler to free the stopped request's blocks",
    )
    assert freed

    # The life of the first request: spans from all four services on one timeline.
    driver.find_element(By.ID, "tab-chat").send_keys(Keys.ARROW_RIGHT)  # keyboard: next tab
    assert driver.find_element(By.ID, "tab-requests").get_attribute("aria-selected") == "true"
    rows = "#traces tbody tr"
    wait_for(lambda: len(driver.find_elements(By.CSS_SELECTOR, rows)) >= 2, why="two requests")
    first = driver.find_elements(By.CSS_SELECTOR, rows)[-1]  # newest first: the first is last
    first.send_keys(Keys.ENTER)

    def whole_trace_shown() -> bool:
        shown = driver.find_elements(By.CSS_SELECTOR, "#trace-detail .span-row")
        names = {row.get_attribute("data-name") for row in shown}
        return (
            set(SERVICES) <= {row.get_attribute("data-service") for row in shown}
            and {
                "tokenize",
                "detokenize",
                "admission",
                "queue",
                "prefill",
                "engine step",
                "forward",
            }
            <= names
        )

    wait_for(whole_trace_shown, why="spans of all four services")

    def open_a_step() -> str:  # its attributes: what the step ran
        for row in driver.find_elements(By.CSS_SELECTOR, "#trace-detail .span-row"):
            if row.get_attribute("data-name") == "engine step":
                assert "running " in row.text  # the step's batch, beside its name
                row.click()
                return text(driver, "#trace-detail .attrs")
        return ""

    assert "layerserve.step" in str(wait_for(open_a_step, why="an engine step's attributes"))
    driver.save_screenshot(str(shots / "requests.png"))

    # A phone-sized window: nothing wider than the screen, every view still there.
    driver.set_window_size(390, 844)
    for view in ("chat", "stack", "requests"):
        driver.find_element(By.ID, f"tab-{view}").click()
        time.sleep(0.3)
        overflow = driver.execute_script(
            "return document.documentElement.scrollWidth - window.innerWidth"
        )
        assert overflow <= 0, f"{view} is {overflow}px wider than a phone"
        driver.save_screenshot(str(shots / f"phone-{view}.png"))
    driver.set_window_size(1280, 900)

    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
