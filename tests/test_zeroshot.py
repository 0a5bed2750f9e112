"""Zero-shot through lm-eval on the in-memory model agrees with direct loglikelihood scoring."""

from __future__ import annotations

import pytest
import torch

from prunelab.errors import ConfigError
from prunelab.evaluation.zeroshot import ZeroShotSpec
from prunelab.models import ModelSpec, load_model
from prunelab.testbed.tasks import task_items


def direct_choice(model, tokenizer, context: str, choices: list[str]) -> tuple[int, float]:
    """argmax over choices of log p(choice | context), and the right-minus-best-wrong margin input."""
    scores = []
    ctx = tokenizer(context, add_special_tokens=False).input_ids
    for choice in choices:
        full = tokenizer(context + choice, add_special_tokens=False).input_ids
        cont = full[len(ctx):]
        inp = torch.tensor([full[:-1]])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=inp, use_cache=False).logits[0].double(), -1)
        scores.append(sum(logp[len(full) - 1 - len(cont) + i, t].item() for i, t in enumerate(cont)))
    return max(range(len(scores)), key=scores.__getitem__), scores


def test_lm_eval_items_match_direct_scoring(tiny_model_dirs, tmp_path, capfd):
    loaded = load_model(ModelSpec(name_or_path=str(tiny_model_dirs["llama"]), device="cpu"))
    spec = ZeroShotSpec(tasks=("tb_agreement", "tb_city"), items=40, batch_size=8, cache_dir=str(tmp_path))
    capfd.readouterr()
    metrics = spec.build(progress=False).evaluate(loaded.model, loaded.tokenizer)
    bars = capfd.readouterr().err
    assert "it/s]" not in bars and "examples/s]" not in bars  # runtime.progress=false silences them
    for task in spec.tasks:
        metric = metrics[f"zeroshot/{task}/acc"]
        items = task_items(task, 40)
        expected, margins = [], []
        for item in items:
            choice, scores = direct_choice(loaded.model, loaded.tokenizer, item["context"], item["choices"])
            expected.append(float(choice == item["gold"]))
            margins.append(scores[item["gold"]] - scores[1 - item["gold"]])
        assert metric.samples["values"] == expected
        assert metric.samples["margins"] == pytest.approx(margins, abs=1e-3)
        assert metric.value == pytest.approx(sum(expected) / len(expected))
        assert metric.protocol["metric"] == "acc" and metric.protocol["n"] == 40
    average = metrics["zeroshot/average"].value
    assert average == pytest.approx((metrics["zeroshot/tb_agreement/acc"].value
                                     + metrics["zeroshot/tb_city/acc"].value) / 2)


def test_bad_zeroshot_settings_are_config_errors():
    with pytest.raises(ConfigError, match="acc_norm"):
        ZeroShotSpec(tasks=("boolq",), metric="f1")
    with pytest.raises(ConfigError, match="unknown local tasks"):
        ZeroShotSpec(tasks=("tb_nope",))
