"""What a run's pictures and pages say about the run in their titles, beside what they show: a random
network (`random weights`), and a run that is not complete (`running: 496 samples so far`: a live
run; `stopped: no process holds it (killed?)`: a file marked running whose writer's lock is gone, the
check `inspect --verify` makes; `failed`, `interrupted`), whose pictures show only the rows written so far.

    run_note(run)            # "random weights · running: 496 samples so far", or ""
    run_status(run)          # "complete", "running", "stopped: no process holds it (killed?)", ...
    unfinished(run)          # "; the run is not complete (stopped: ..., 96 samples so far): ...", or ""
    so_far(run)              # "96 samples so far" (an SAE training's: "10 logged steps so far")
    weights_note(config)     # "random weights", or ""
"""

from __future__ import annotations

from typing import Any

STOPPED = "stopped: no process holds it (killed?)"


def run_status(run: Any) -> str:
    """The file's status, except that a local file marked running which no process writes (its lock
    is not held: store/live.py's live_writer, as `inspect --verify` asks) is STOPPED: a killed process
    leaves `running` in the file, and its lock is dropped with it (docs/format.md)."""
    from pathlib import Path

    from hookrun.store.live import live_writer

    status = str(run.status)
    return STOPPED if status == "running" and isinstance(run.path, Path) and live_writer(run.path) is None else status


def run_note(run: Any) -> str:
    """The run's notes for a title, joined by ` · `: its weights', and how far it got if not complete."""
    status = run_status(run)
    done = "" if status == "complete" else f"{status}{',' if status == STOPPED else ':'} {so_far(run)}"
    return " · ".join(n for n in (weights_note(run.config), done) if n)


def unfinished(run: Any) -> str:
    """Why a run that is not complete may have nothing to show, for a message ending "nothing to show": ""
    for a complete run, else its status and how far it got (a killed run's file holds only what it wrote
    as it went; a kind's results written at the end of a pass, a similarity matrix or a probe's scores, are
    not there)."""
    status = run_status(run)
    if status == "complete":
        return ""
    return (f"; the run is not complete ({status}{',' if status == STOPPED else ':'} {so_far(run)}): results written "
            "at the end of a complete pass (a similarity matrix, a probe's scores) are not in the file; run it again "
            "to the end")


def so_far(run: Any) -> str:
    """How far a run got, in its kind's rows as its log counts them (an SAE training's `10 logged steps`, a patching
    run's cells; else samples): the file's samples_complete."""
    from hookrun.analysis.kind_readers import kind_units

    readers = getattr(run, "kind_readers", None)
    unit = kind_units(readers())[1] if callable(readers) else "samples"
    return f"{run.attrs.get('samples_complete', '?')} {unit} so far"


def random_weights(config: Any) -> bool:
    """Whether the run's model had random weights, as its config says: a torchvision builder with
    `weights: null`, a timm model with `pretrained: false`, a transformers model from a config (no
    `path`), each with no `checkpoint`. tiny_cnn and tiny_lm load their shipped trained weights;
    torchvision_cached's `cached` depends on the machine, and a user's own model is not known: False."""
    model = (config or {}).get("model") if isinstance(config, dict) else None
    if not isinstance(model, dict) or model.get("checkpoint"):
        return False
    target = str(model.get("_target_", ""))
    if target.startswith("torchvision.models.") or target == "hookrun.models.vision.torchvision_cached":
        return model.get("weights", "cached" if "cached" in target else None) in (None, "None", "none", "null")
    if target == "hookrun.models.vision.timm_model":
        return str(model.get("pretrained", False)).lower() in ("false", "0", "no", "none")
    if target == "hookrun.models.hf":
        return not model.get("path")
    return False


def weights_note(config: Any) -> str:
    """What a picture's title says about the model's weights: `random weights`, or nothing."""
    return "random weights" if random_weights(config) else ""
