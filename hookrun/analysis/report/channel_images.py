"""Top examples of a convolutional layer's channels as pictures: each example's input image (the
run's own recorded input) with the channel's map over it, for the report's latents section.

    pics = ChannelImages.of(run, capture)     # None unless `capture` is a 4-D map and the run recorded images
    pics.src(sample=17, channel=3)            # a PNG data URI, or None where the run kept no row of that sample

The map is the channel's (H, W) activations of that sample, resized to the image (bilinear), on the
sequential scale from 0 to the channel's largest value over the examples shown (`top`), at half
opacity over the image scaled to [0, 1] (gradcam_section.overlay_png draws both).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hookrun.analysis.gradcam import _index, as_pictures, is_map
from hookrun.analysis.report.gradcam_section import overlay_png


class ChannelImages:
    def __init__(self, run: Any, maps: Any, images: Any) -> None:
        self.run, self.maps, self.images = run, maps, images
        self.map_rows = {int(i): r for r, i in enumerate(_index(run, maps))}
        self.image_rows = {int(i): r for r, i in enumerate(_index(run, images))}

    @classmethod
    def of(cls, run: Any, capture: Any) -> ChannelImages | None:
        if capture is None or not is_map(capture):
            return None
        found = [c for c in run.captures if c.role == "input" and len(c.shape) == 4 and c.shape[1] in (1, 3) and c.rows == "samples"]
        found.sort(key=lambda c: (c.module != "", -c.shape[2] * c.shape[3]))
        return cls(run, capture, found[0]) if found else None

    def channel(self, sample: int, channel: int) -> np.ndarray | None:
        r = self.map_rows.get(int(sample))
        return None if r is None else np.asarray(self.run.file[self.maps.path][r, channel], dtype=np.float64)

    def src(self, sample: int, channel: int, top: float) -> str | None:
        m, r = self.channel(sample, channel), self.image_rows.get(int(sample))
        if m is None or r is None:
            return None
        picture = as_pictures(np.asarray(self.run.file[self.images.path][r : r + 1]))[0]
        if m.shape != picture.shape[:2]:
            from PIL import Image

            m = np.asarray(Image.fromarray(m.astype(np.float32), mode="F").resize(picture.shape[1::-1], Image.BILINEAR), dtype=np.float64)
        return overlay_png(np.clip(m, 0, None) / (top if top > 0 else 1.0), picture)
