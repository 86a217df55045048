"""A screenshot of a tracked run in TensorBoard's own web UI (issue 40): starts `tensorboard` on the
run's event files and renders its page in headless Chromium driven by Playwright, so what a user sees
is shown from the real UI, not redrawn. Needs Debian's Chromium and the Playwright package (not a
project dependency):

    apt-get install chromium && .venv/bin/pip install playwright
    .venv/bin/mgrpo demo --tracking tensorboard --run-dir runs/tracked
    .venv/bin/python bench/ui_screenshot.py runs/tracked/tracking/tensorboard --out docs/tensorboard-ui.png

`--filter` narrows the page to tags matching a regular expression (TensorBoard's own tag filter, in the
page's address), e.g. `reward_mean|success` to show those curves of every role side by side.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_serving(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Until `url` answers 200 (TensorBoard has loaded the runs), or the server exits, or the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"tensorboard exited with {proc.returncode} before serving")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200 and r.read().strip() not in (b"", b"{}"):
                    return
        except OSError:
            pass
        time.sleep(0.5)  # polling a server we started: there is no event to wait on
    raise SystemExit(f"tensorboard did not serve {url} within {timeout_s:.0f} s")


def settled(page: Any, timeout_s: float = 60.0) -> bytes:
    """A screenshot once the page stops changing: TensorBoard draws its charts in a worker after the
    data arrived, so the page's pixels are the only state to wait on (three equal shots in a row)."""
    shots: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        shots.append(page.screenshot())
        if len(shots) >= 3 and shots[-1] == shots[-2] == shots[-3]:
            return shots[-1]
        page.wait_for_timeout(700)
    raise SystemExit(f"the page kept changing for {timeout_s:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logdir", type=Path, help="<run dir>/tracking/tensorboard")
    ap.add_argument("--out", type=Path, default=Path("docs/tensorboard-ui.png"))
    ap.add_argument("--filter", default="reward_mean|success|flat_share|grad_norm")
    ap.add_argument("--size", default="1600,1100", help="window width,height in pixels")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium on PATH: apt-get install chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SystemExit("no playwright: .venv/bin/pip install playwright") from None
    width, height = (int(x) for x in args.size.split(","))
    port = free_port()
    tensorboard = Path(sys.executable).with_name("tensorboard")
    cmd = [str(tensorboard), "--logdir", str(args.logdir), "--port", str(port), "--host", "127.0.0.1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_serving(f"{base}/data/runs", proc)
        page_url = f"{base}/?tagFilter={urllib.parse.quote(args.filter)}#timeseries"
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=chromium,
                args=["--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader"],
            )  # software WebGL: TensorBoard draws its charts with it
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(page_url)
            page.wait_for_selector("line-chart canvas, line-chart svg", timeout=60_000)
            page.wait_for_load_state("networkidle")  # every card's series fetched
            args.out.write_bytes(settled(page))
            browser.close()
        print(f"wrote {args.out} ({page_url})")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
