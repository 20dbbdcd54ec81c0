"""MIB's rows through the command line: experiment=edges with data.dataset={_target_: hookrun.data.mib.mib_task, ...}
says the overrides that replace its data set, and they run as written. The line said `data=custom ...`, which
leaves the experiment's own data.dataset.n and length, so its overrides failed ('mib_task() got an unexpected
keyword argument n'); and mib_task took no tokenizer a config can name ('byte' ended in 'LookupError: unknown
encoding'): it takes byte or a tokenizer folder, as data=text does. The reference: the clean metric of the run
against a raw forward of the shipped model on MIB's kept rows, tokenized by the byte tokenizer's definition (a
BOS, then byte + 3) and read at each row's last real token."""

from __future__ import annotations

import json
import shlex

import numpy as np
import torch
from conftest import run_cli

import hookrun
from hookrun.data.mib import ioi_rows
from hookrun.models.tiny_lm import tiny_lm


def test_mib_rows_on_experiment_edges_by_the_said_overrides(tmp_path):
    rows = ioi_rows(n=12, seed=1)
    (tmp_path / "ioi.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    given = (f"data.dataset={{_target_: hookrun.data.mib.mib_task, rows: {tmp_path / 'ioi.jsonl'}, tokenizer: byte, "
             f"task: ioi, answer_space: false}}")
    proc = run_cli("experiment=edges", given, f"hydra.run.dir={tmp_path / 'bad'}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    said = proc.stderr.split("to replace data.dataset, write ", 1)[1].split("; to add one entry", 1)[0]
    assert "'~data.dataset.n' '~data.dataset.length'" in said
    proc = run_cli("experiment=edges", *shlex.split(said), "patching.metric.position=position", "patching.method=eap",
                   "patching.ig_steps=1", "progress=false", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with hookrun.open_run(tmp_path / "run" / "captures.h5") as run:
        meta = json.loads(run.attrs["patching"])

    kept = [r for r in rows if len({len(r["metadata"][k]) for k in ("indirect_object", "subject", "random_c")}) == 1]
    assert kept
    model, diffs = tiny_lm(), []
    with torch.no_grad():
        for r in kept:
            ids = torch.tensor([[1] + [b + 3 for b in r["prompt"].encode()]])
            last = model(ids).logits[0, -1]
            diffs.append(float(last[ord(r["metadata"]["indirect_object"][0]) + 3] - last[ord(r["metadata"]["subject"][0]) + 3]))
    assert abs(meta["metric_clean"] - np.mean(diffs)) < 1e-5
