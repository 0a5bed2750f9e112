"""The W&B run of a real pipeline run, read back from its offline files: names, streamed steps,
summary, tables and artifacts."""

from __future__ import annotations

from test_cli import tiny_run_overrides
from wandb_offline import read_offline_run

import prunelab


def test_offline_run_reads_back_with_names_steps_summary_and_artifacts(tiny_model_dirs, text_file,
                                                                       tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    overrides = [o for o in tiny_run_overrides(tiny_model_dirs["llama"], text_file, tmp_path) if o != "tracking=none"]
    record = prunelab.run([*overrides, "tracking=wandb", f"tracking.dir={tmp_path}", "save_model=true",
                           "study=api_check"])
    [run_dir] = list((tmp_path / "wandb").glob("offline-run-*"))
    run = read_offline_run(run_dir)

    signature = record["signature"]
    assert run.name == "wanda-0.5-uniform-llama-seed0"
    assert run.group == f"wanda-0.5-uniform-llama-{signature[:6]}" and run.job_type == "wanda"
    assert {"api_check", "wanda", "uniform", "llama"} <= set(run.tags)
    assert run.config["signature"] == signature and run.config["pruning"]["sparsity"] == 0.5

    # streamed: stage times as they finish, dense before pruned, one step per pruned layer
    steps = [set(step) for step in run.history]

    def first(key: str) -> int:
        found = [i for i, keys in enumerate(steps) if key in keys]
        assert found, f"{key} in no logged step; the steps logged: {[sorted(s) for s in steps]}"
        return found[0]

    ppl = "ppl/local_text/token"
    assert first("time/load_s") < first(f"dense/{ppl}") < first("prune/layer") < first(f"pruned/{ppl}")
    layers = [step["prune/layer"] for step in run.history if "prune/layer" in step]
    assert layers == list(range(4))
    assert all(abs(s["prune/layer_sparsity"] - 0.5) < 1e-9 for s in run.history if "prune/layer" in s)

    assert run.summary[f"pruned/{ppl}"] == record["metrics"]["pruned"][ppl]["value"]
    assert run.summary["status"] == "completed" and abs(run.summary["sparsity/overall"] - 0.5) < 1e-9
    assert run.summary[f"change_pct/{ppl}"] > 0  # pruning raised perplexity
    items = sum(len(m["samples"]["values"]) for k, m in record["metrics"]["pruned"].items()
                if k.startswith("zeroshot/") and k != "zeroshot/average")
    assert run.summary["zeroshot/items/_type"] == "table-file" and run.summary["zeroshot/items/nrows"] == items
    assert run.summary["sparsity/per_layer/nrows"] == 4
    kinds = dict((kind, name) for name, kind in run.artifacts)
    assert kinds["result"] == f"record-{signature}-seed0" and kinds["model"] == f"model-{signature}-seed0"
