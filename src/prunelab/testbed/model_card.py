"""Model cards (README.md) for shipped testbed models, with every number measured by code.

``write_cards(output_dir)`` reads ``training_stats.json`` written by ``train``, evaluates the
model(s) with ``quality.evaluate`` and writes ``README.md``: the single model directory, or for a
checkpoint series the series root (full report on the final step, perplexity and tasks for each
step) plus a short card in every ``step<N>/``. Re-run alone with
``python -m prunelab.testbed.model_card <output_dir>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from pathlib import Path

import torch

from prunelab.testbed import corpus, quality, tasks

logger = logging.getLogger(__name__)


def _load(directory: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(str(directory))


def _step_dirs(output_dir: Path) -> list[Path]:
    steps = [d for d in output_dir.iterdir() if d.is_dir() and re.fullmatch(r"step\d+", d.name)]
    return sorted(steps, key=lambda d: int(d.name[4:]))


def _directory_megabytes(directory: Path) -> float:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file()) / 2**20


def _task_table(rows: dict[str, dict[str, float]]) -> str:
    header = "| model | " + " | ".join(tasks.TASKS) + " |"
    lines = [header, "|" + "---|" * (len(tasks.TASKS) + 1)]
    for label, accuracies in rows.items():
        cells = " | ".join(f"{100 * accuracies[t]:.1f}" for t in tasks.TASKS)
        lines.append(f"| {label} | {cells} |")
    return "\n".join(lines)


def render_report(stats: dict, report: dict, title: str) -> str:
    """Markdown for one fully evaluated model."""
    model = stats["recipe"]["model"]
    removal = report["layer_removal_ppl_increase"]
    architecture = ("LlamaForCausalLM" if stats["arch"] == "llama" else "GPTNeoXForCausalLM")
    lines = [
        f"# {title}",
        "",
        f"A tiny `{architecture}` trained from scratch on CPU on the synthetic testbed language "
        f"(`prunelab.testbed.corpus`, corpus version `{stats['corpus_version']}`). It exists so "
        "pruning methods can be studied offline on a model that memorises facts and uses depth.",
        "",
        "## Training",
        "",
        f"- parameters: {stats['parameters']:,} (float32); architecture: "
        + ", ".join(f"{k}={v}" for k, v in model.items()),
        f"- steps: {stats['steps']}, tokens: {stats['tokens']:,} "
        f"(batch {stats['recipe']['train']['batch_size']} x {stats['recipe']['train']['seq_len']})",
        f"- wall time: {stats['wall_minutes']:.1f} min at "
        f"{stats['tokens_per_second']:.0f} tokens/s "
        f"({stats['recipe']['train']['threads']} CPU thread(s))",
        f"- final train loss: {stats['final_train_loss']:.4f}; final validation loss: "
        f"{stats['final_val_loss']:.4f}",
        f"- regenerate: `python -m prunelab.testbed.train recipe={stats['name']}` (the budget is "
        "wall-clock minutes, so the step count depends on the machine; data order is fixed; "
        f"`train.minutes=null train.steps={stats['steps']}` runs a step-scheduled equivalent)",
        "",
        "## Quality (computed by `prunelab.testbed.quality` with the project's evaluators and methods)",
        "",
        f"- test perplexity: {report['test_ppl']:.3f} (`data=testbed` token protocol: non-overlapping "
        f"windows of {report['window']} tokens over the test documents joined by blank lines)",
        f"- validation perplexity: {report['validation_ppl']:.3f}",
        f"- unigram perplexity of the corpus (train unigram, test tokens): "
        f"{report['unigram_ppl']:.1f}; ratio unigram/test = "
        f"{report['unigram_ppl'] / report['test_ppl']:.1f}",
        f"- magnitude pruning 50% (per matrix, decoder-block linears): ppl "
        f"{report['magnitude_50']['ppl']:.3f} "
        f"(+{100 * report['magnitude_50']['ppl_increase']:.1f}%)",
        f"- magnitude pruning 70%: ppl {report['magnitude_70']['ppl']:.3f} "
        f"(+{100 * report['magnitude_70']['ppl_increase']:.1f}%)",
        f"- single-layer removal, ppl increase: min {100 * min(removal):.1f}%, "
        f"max {100 * max(removal):.1f}%; per layer: "
        + ", ".join(f"L{i}: {100 * x:+.1f}%" for i, x in enumerate(removal)),
        "",
        f"### Zero-shot accuracy (%) on {quality.TASK_ITEMS} held-out items per task, two choices each "
        "(chance 50%)",
        "",
        _task_table({
            "dense": report["tasks"],
            "magnitude 50%": report["magnitude_50"]["tasks"],
            "magnitude 70%": report["magnitude_70"]["tasks"],
        }),
        "",
    ]
    return "\n".join(lines)


def limits_section(model, tokenizer) -> str:
    """What the testbed cannot answer: it has no massive activations (prunelab.probes.activations)."""
    from prunelab.data import CalibrationSpec, calibration_samples
    from prunelab.models import ModelAdapter, architecture_for
    from prunelab.probes.activations import profile, summary

    spec = CalibrationSpec(source="testbed", nsamples=4, seqlen=256)
    adapter = ModelAdapter(model, architecture_for(model.config.model_type))
    peak = summary(profile(adapter, calibration_samples(spec, tokenizer, seed=0)))
    dims = ", ".join(f"{dim} ({count}x)" for dim, count in peak["top_dims"])
    return (
        "\n## Limits: no massive activations\n\n"
        f"The residual stream's largest |h| is at most {peak['max_ratio']:.0f} times its median "
        f"(state {peak['at_state']}, {spec.nsamples} x {spec.seqlen} test-language tokens; "
        f"`prunelab activations`), and the dimension holding the maximum moves "
        f"from state to state (most often: {dims}). Pretrained LLMs have a few fixed dimensions "
        "thousands of times the median (measured for SmolLM2-135M in docs/smollm2_135m.md), which is "
        "what Wanda's activation term, OWL and PALS exploit. Studies on this model check the "
        "mechanics of a method; its claims are checked on `model=smollm2_135m`.\n")


def write_cards(output_dir: Path) -> dict:
    """Evaluate and write README.md file(s) under ``output_dir``; returns the reports."""
    output_dir = Path(output_dir)
    stats = json.loads((output_dir / "training_stats.json").read_text())
    steps = _step_dirs(output_dir)
    if not steps:
        model, tokenizer = _load(output_dir)
        report = quality.evaluate(model, tokenizer)
        card = render_report(stats, report, stats["name"]) + limits_section(model, tokenizer)
        card += f"\nDirectory size: {_directory_megabytes(output_dir):.1f} MB.\n"
        (output_dir / "README.md").write_text(card)
        (output_dir / "quality.json").write_text(json.dumps(report, indent=2) + "\n")
        return {"final": report}
    final = steps[-1]
    model, tokenizer = _load(final)
    report = quality.evaluate(model, tokenizer)
    per_step = {}
    for directory in steps:
        model, tokenizer = _load(directory)
        per_step[directory.name] = {
            "test_ppl": quality.test_perplexity(model, tokenizer),
            "tasks": quality.all_task_accuracies(model, tokenizer),
        }
        logger.info("%s: %s", directory.name, per_step[directory.name])
    card = render_report(stats, report, f"{stats['name']} (final checkpoint `{final.name}`)")
    card += limits_section(model, tokenizer)
    card += ("\n## Checkpoints\n\nLoad a checkpoint with `revision=\"step<N>\"` meaning the "
             "subfolder (e.g. `from_pretrained(path / \"step0\")`); the final step is the "
             "default.\n\n")
    card += ("Checkpoints are taken when training progress (wall-clock budget, see the recipe) "
             "crosses Pythia's proportions 0, 1/143, 16/143, 64/143 and 143/143, so the step "
             "fractions below are approximate.\n\n")
    card += "| checkpoint | fraction of steps | test ppl | size MB |\n|---|---|---|---|\n"
    for directory in steps:
        fraction = int(directory.name[4:]) / max(1, stats["steps"])
        card += (f"| {directory.name} | {fraction:.4f} | "
                 f"{per_step[directory.name]['test_ppl']:.3f} | "
                 f"{_directory_megabytes(directory):.1f} |\n")
    card += "\n" + _task_table({name: row["tasks"] for name, row in per_step.items()}) + "\n"
    (output_dir / "README.md").write_text(card)
    (output_dir / "quality.json").write_text(
        json.dumps({"final": report, "steps": per_step}, indent=2) + "\n")
    for directory in steps:
        row = per_step[directory.name]
        (directory / "README.md").write_text(
            f"# {stats['name']} {directory.name}\n\nCheckpoint {directory.name} of "
            f"{stats['steps']} steps of `{stats['name']}` (corpus `{corpus.CORPUS_VERSION}`). "
            f"Test perplexity {row['test_ppl']:.3f}. See ../README.md for the full card.\n")
    return {"final": report, "steps": per_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    write_cards(Path(args.output_dir))


if __name__ == "__main__":
    main()
