"""patching.metric.normalize with m_clean < m_corrupt: the file stores the scores over the (negative) gap,
and the run's own CPR / CMD rank those same scores, so exporting them and scoring them again with
`python -m hookrun.circuits score` gives the run's numbers.

The reference is the metric's sign: logit_diff with answer and wrong swapped is -logit_diff, so the raw
edge scores and the gap both change sign and the normalized scores, the faithfulness f (a ratio of metric
differences) and so MIB's CPR and CMD are those of the unswapped run (gap > 0). Before the fix the run
ranked the raw scores: CPR 0.2349 beside 1.117 for the exported file on the user's model.
"""

from __future__ import annotations

import json

import numpy as np

import hookrun
from hookrun.circuits import main

FRACTIONS = [0.01, 0.05, 0.1, 0.2, 0.5, 1.0]


def run(path, swapped: bool, normalize: bool = True) -> dict:
    answer, wrong = ("wrong", "answer") if swapped else ("answer", "wrong")
    cfg = {"model": {"_target_": "hookrun.models.tiny_lm"},
           "data": {"dataset": {"_target_": "hookrun.data.swaps.word_swap", "n": 2, "length": 8}, "target": None},
           "progress": False, "output": {"path": str(path), "overwrite": True},
           "patching": {"input": "input_ids", "method": "eap", "ig_steps": 1,
                        "metric": {"name": "logit_diff", "answer": answer, "wrong": wrong, "normalize": normalize},
                        "faithfulness": {"edges": [10], "fractions": FRACTIONS, "ablation": "corrupt"}}}
    hookrun.run(cfg)
    return json.loads(hookrun.open_run(path).attrs["patching"])


def test_negative_gap_cpr_is_the_exported_scores_cpr(tmp_path, capsys):
    neg = run(tmp_path / "neg.h5", swapped=True)
    assert neg["metric_clean"] < neg["metric_corrupt"]
    pos = run(tmp_path / "pos.h5", swapped=False)
    np.testing.assert_allclose(neg["node_scores"], pos["node_scores"], rtol=1e-6, atol=1e-9)  # scores / gap: the same
    mib_neg, mib_pos = neg["faithfulness"]["mib"], pos["faithfulness"]["mib"]
    assert mib_neg["cpr"]["kept"] == mib_pos["cpr"]["kept"]
    np.testing.assert_allclose(mib_neg["cpr"]["area"], mib_pos["cpr"]["area"], rtol=1e-6)
    np.testing.assert_allclose(mib_neg["cmd"]["area"], mib_pos["cmd"]["area"], rtol=1e-6)

    assert main(["export", str(tmp_path / "neg.h5"), "--format", "eap-ig", str(tmp_path / "neg.json")]) == 0
    fr = ",".join(map(str, FRACTIONS))
    assert main(["score", str(tmp_path / "neg.h5"), "--circuit", str(tmp_path / "neg.json"), "--fractions", fr,
                 "--out", str(tmp_path / "scored.h5")]) == 0
    again = json.loads(hookrun.open_run(tmp_path / "scored.h5").attrs["patching"])["faithfulness"]["mib"]
    assert again["cpr"]["kept"] == mib_neg["cpr"]["kept"]
    np.testing.assert_allclose(again["cpr"]["area"], mib_neg["cpr"]["area"], rtol=1e-6)
    np.testing.assert_allclose(again["cmd"]["area"], mib_neg["cmd"]["area"], rtol=1e-6)
    assert f"CPR {mib_neg['cpr']['area']:.4g}" in capsys.readouterr().out
