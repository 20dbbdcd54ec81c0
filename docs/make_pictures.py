"""Make the pictures of the README and docs/ from the commands printed next to them.

    python docs/make_pictures.py                  # runs the README's "See it" commands, writes docs/images/*.png
    python docs/make_pictures.py --images /tmp/x  # the same, the pictures elsewhere (tests/docs/test_pictures.py)

The commands are read from the README's "## See it" bash block and run as written (`python` is
this interpreter), in a fresh work folder, so the pictures are what a user who types them gets:

- docs/images/shapes_gradcam.png: `python -m hookrun.plot outputs/shapes`'s Grad-CAM figure;
- docs/images/report.png: `python -m hookrun.report outputs/shapes`'s page, opened in headless
  Chromium (Debian's chromium and chromium-driver, driven by selenium) with the network blocked:
  its title bar and its Grad-CAM section;
- docs/images/attribution_shapes.png and attribution_shapes_curves.png: docs/attribution.md's first
  bash block and its "## Pictures" block, run as written (`python -m hookrun.plot`'s attribution maps
  and curves);
- docs/images/probe_shapes.png and probe_tokens.png: docs/probe.md's first bash block and its
  "## The token experiment" block, run as written (`python -m hookrun.plot`'s probe_depth figures);
- docs/images/cka_resnet.png: docs/similarity.md's first bash block, run as written (`python -m
  hookrun.plot`'s similarity heatmap).

Every picture in README.md and docs/*.md is one of these (tests/docs/test_pictures.py checks both).
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PICTURES = ("shapes_gradcam.png", "report.png", "attribution_shapes.png", "attribution_shapes_curves.png",
            "probe_shapes.png", "probe_tokens.png", "cka_resnet.png")  # every picture the README and docs show


def see_it_commands(readme: Path = ROOT / "README.md") -> list[str]:
    """The command lines of the README's "## See it" bash block."""
    return _bash_block(readme, "## See it")


def attribution_commands(page: Path = ROOT / "docs" / "attribution.md") -> list[str]:
    """docs/attribution.md's first bash block (the run) and its "## Pictures" block (the plot)."""
    return [*_bash_block(page, "# Attribution"), *_bash_block(page, "## Pictures")]


def similarity_commands(page: Path = ROOT / "docs" / "similarity.md") -> list[str]:
    """docs/similarity.md's first bash block (the run and its plot)."""
    return _bash_block(page, "# Representational similarity")


def _bash_block(page: Path, heading: str) -> list[str]:
    """The command lines of the first bash block under `heading` in `page`."""
    text = page.read_text(encoding="utf-8")
    part = text[text.index(heading):]
    part = part[: part.find("\n## ", 1)]
    block = re.search(r"```bash\n(.*?)```", part, re.S)
    if block is None:
        raise SystemExit(f"{page.name}: no bash block under {heading!r}")
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.split("#")[0].strip()]


def run_commands(commands: list[str], work: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    for line in commands:
        argv = shlex.split(line)
        argv = [sys.executable if argv[0] == "python" else argv[0], *argv[1:]]
        print("$", line, flush=True)
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode:
            raise SystemExit(f"`{line}` failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")


def screenshot(page: Path, out: Path) -> None:
    """The report's title bar and its Grad-CAM section (headless Chromium, no network)."""
    from PIL import Image
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,900",
                "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND", "--hide-scrollbars"):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)
    try:
        driver.get(page.resolve().as_uri())
        for _ in range(200):
            if driver.execute_script("return document.body.dataset.ready") == "1":
                break
            time.sleep(0.1)
        driver.execute_script("window.scrollTo(0, document.getElementById('section-gradcam').offsetTop"
                              " - document.querySelector('header').offsetHeight - 12)")
        time.sleep(0.5)
        shot = driver.get_screenshot_as_png()
        height = driver.execute_script("return document.querySelector('header').offsetHeight"
                                       " + document.getElementById('section-gradcam').offsetHeight + 24")
    finally:
        driver.quit()
    with Image.open(io.BytesIO(shot)) as image:
        image.convert("RGB").crop((0, 0, image.width, min(image.height, int(height)))).save(out, optimize=True)


def make(images: Path, work: Path) -> list[Path]:
    run_commands(see_it_commands(), work)
    figures = work / "outputs" / "shapes" / "figures"
    images.mkdir(parents=True, exist_ok=True)
    copy_png(figures / "gradcam_block3.png", images / "shapes_gradcam.png", work)
    screenshot(work / "outputs" / "shapes" / "report.html", images / "report.png")
    run_commands(attribution_commands(), work)
    drawn = work / "outputs" / "attribution_shapes" / "figures"
    copy_png(drawn / "attribution_integrated_gradients.png", images / "attribution_shapes.png", work)
    copy_png(drawn / "attribution_curves_integrated_gradients.png", images / "attribution_shapes_curves.png", work)
    probe = ROOT / "docs" / "probe.md"
    run_commands([*_bash_block(probe, "# Probes"), *_bash_block(probe, "## The token experiment")], work)
    for name in ("shapes", "tokens"):
        copy_png(work / "outputs" / f"probe_{name}" / "figures" / "probe_depth.png", images / f"probe_{name}.png", work)
    run_commands(similarity_commands(), work)
    copy_png(work / "outputs" / "cka_resnet" / "figures" / "similarity.png", images / "cka_resnet.png", work)
    return [images / name for name in PICTURES]


def copy_png(src: Path, dst: Path, work: Path) -> None:
    """Copy a picture, its `Source` text (the run file it was drawn from) made relative to the work
    folder, as a user's own folder would show it: the same commands give the same bytes wherever
    the temporary folder is."""
    from PIL import Image, PngImagePlugin

    with Image.open(src) as im:
        info = PngImagePlugin.PngInfo()
        for key, value in im.text.items():
            info.add_text(key, os.path.relpath(value, work) if key == "Source" and os.path.isabs(value) else value)
        im.save(dst, pnginfo=info, **({"dpi": im.info["dpi"]} if "dpi" in im.info else {}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=Path, default=ROOT / "docs" / "images", help="where the pictures go")
    p.add_argument("--work", type=Path, default=None, help="the folder the commands run in (default: a new temporary one)")
    a = p.parse_args(argv)
    if a.work is not None:
        a.work.mkdir(parents=True, exist_ok=True)
        written = make(a.images, a.work)
    else:
        with tempfile.TemporaryDirectory(prefix="hookrun-pictures-") as work:
            written = make(a.images, Path(work))
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
