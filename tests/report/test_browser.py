"""The report page in headless Chromium: every <img> renders (naturalWidth > 0).

Skips only when no Chromium is installed AND ``SPECROUND_REQUIRE_BROWSER`` is unset (``.ci/run`` installs
Debian's ``chromium`` and sets it, so CI fails instead of skipping). The page itself carries no script: the
test loads a copy with a probe appended that, on ``load``, writes every image's size into the DOM, and
reads it back with ``--dump-dom``.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from specround.adapters.sql import SqlEventLog
from specround.audit import audit_log
from specround.report import write_report
from specround.report.synthetic import SyntheticLogSummary

REQUIRE_ENV = "SPECROUND_REQUIRE_BROWSER"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PROBE = """<script>
window.addEventListener("load", function () {
  var images = Array.prototype.map.call(document.images, function (img) {
    return {src: img.getAttribute("src"), width: img.naturalWidth, height: img.naturalHeight};
  });
  var out = document.createElement("pre");
  out.id = "image-probe";
  out.textContent = JSON.stringify(images);
  document.body.appendChild(out);
});
</script>"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{REQUIRE_ENV} is set but no chromium is installed")
    pytest.skip("chromium is not installed")
    raise AssertionError("unreachable")


def test_every_report_image_renders_in_chromium(
    synthetic_log: tuple[Path, SyntheticLogSummary], tmp_path: Path
) -> None:
    browser = chromium()
    with SqlEventLog.open(synthetic_log[0], create=False) as log:
        result = write_report(log, tmp_path / "report", audit=audit_log(log), log_name="synthetic.sqlite")
    page = result.index.read_text(encoding="utf-8")
    probe = result.index.with_name("probe.html")
    # A deliberately missing image shows that the probe can see a broken one.
    control = '<img src="missing-control.png" alt="control">'
    probe.write_text(page.replace("</body>", control + PROBE + "</body>"), encoding="utf-8")
    profile = tmp_path / "profile"
    profile.mkdir()
    done = subprocess.run(
        [
            browser,
            *FLAGS,
            f"--user-data-dir={profile}",
            "--virtual-time-budget=20000",
            "--dump-dom",
            probe.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    match = re.search(r'<pre id="image-probe">(.*?)</pre>', done.stdout, re.S)
    assert match is not None, done.stdout[-2000:]
    images = json.loads(html.unescape(match.group(1)))
    [missing] = [image for image in images if image["src"] == "missing-control.png"]
    assert missing["width"] == 0
    images.remove(missing)
    assert sorted(image["src"] for image in images) == sorted(p.name for p in result.figures.values())
    for image in images:
        assert image["width"] > 0 and image["height"] > 0, image
