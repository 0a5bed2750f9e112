"""The shared-context scorer gives HFLM's log-likelihoods while running each shared context once."""

from __future__ import annotations

import pytest
from tiny import ARCHS

from prunelab.models import ModelSpec, load_model

WORDS = ("the cat sat on the mat . the dogs that the boy owns are happy . she gives the key to him . "
         "seven plus five is twelve . alice lives in paris and works as a baker .").split()


def _requests():
    """Contexts of several lengths, each with choices of several lengths (one-token ones too), a
    context with one continuation, and two contexts sharing one continuation (WinoGrande's shape)."""
    from lm_eval.api.instance import Instance

    pairs = []
    for start, size in ((0, 3), (4, 9), (10, 17), (2, 6)):
        context = " ".join(WORDS[start:start + size])
        for choice in (" cat", " the dogs that the boy owns", " seven plus five is twelve .", " alice"):
            pairs.append((context, choice))
    pairs.append(("she gives the key", " to him ."))
    pairs += [("the boy owns the cat", " are happy ."), ("the boy owns the dogs", " are happy .")]
    return [Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=i) for i, pair in enumerate(pairs)]


def _count_tokens(model) -> list[int]:
    seen = [0]

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        seen[0] += ids.numel()

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


@pytest.mark.parametrize("arch", ARCHS)
def test_shared_context_loglikelihoods_equal_hflm(tiny_model_dirs, arch):
    from lm_eval.models.huggingface import HFLM

    from prunelab.evaluation.shared_context import SharedContextLM

    loaded = load_model(ModelSpec(name_or_path=str(tiny_model_dirs[arch]), device="cpu"))
    counted = _count_tokens(loaded.model)
    reference = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=4).loglikelihood(
        _requests(), disable_tqdm=True)
    full_tokens, counted[0] = counted[0], 0
    scorer = SharedContextLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=4, context_batch=3)
    assert scorer._head is not None  # the remainders' output layer runs on their scored positions only
    shared = scorer.loglikelihood(_requests(), disable_tqdm=True)
    assert len(shared) == len(reference)
    for (got, got_greedy), (want, want_greedy) in zip(shared, reference):
        assert got == pytest.approx(want, abs=1e-4) and got_greedy == want_greedy
    assert counted[0] < full_tokens  # the contexts ran once, not once per choice


def test_a_model_that_changes_its_logits_after_the_head_keeps_its_whole_forward(tiny_model_dirs):
    """Logits scaled after the output layer (as a soft-capping model does): the split head would
    miss the scaling, so the scorer runs the model's own forward and still gives HFLM's numbers."""
    import functools

    from lm_eval.models.huggingface import HFLM

    from prunelab.evaluation.shared_context import SharedContextLM

    model = load_model(ModelSpec(name_or_path=str(tiny_model_dirs["llama"]), device="cpu"))
    original = model.model.forward

    @functools.wraps(original)
    def scaled(*args, **kwargs):
        out = original(*args, **kwargs)
        out.logits = out.logits * 0.5
        return out

    model.model.forward = scaled
    reference = HFLM(pretrained=model.model, tokenizer=model.tokenizer, batch_size=4).loglikelihood(
        _requests(), disable_tqdm=True)
    scorer = SharedContextLM(pretrained=model.model, tokenizer=model.tokenizer, batch_size=4)
    assert scorer._head is None
    for (got, got_greedy), (want, want_greedy) in zip(scorer.loglikelihood(_requests(), disable_tqdm=True),
                                                      reference):
        assert got == pytest.approx(want, abs=1e-4) and got_greedy == want_greedy


def test_the_evaluator_with_either_scorer_grades_every_item_alike(tiny_model_dirs, tmp_path):
    from prunelab.evaluation.zeroshot import ZeroShotSpec

    loaded = load_model(ModelSpec(name_or_path=str(tiny_model_dirs["llama"]), device="cpu"))
    results = {}
    for scorer in ("lm_eval", "shared_context"):
        spec = ZeroShotSpec(tasks=("tb_city", "tb_agreement"), items=30, batch_size=8, scorer=scorer,
                            cache_dir=str(tmp_path))
        results[scorer] = spec.build(progress=False).evaluate(loaded.model, loaded.tokenizer)
    for key, metric in results["lm_eval"].items():
        other = results["shared_context"][key]
        assert other.value == pytest.approx(metric.value)
        if metric.samples:
            assert other.samples["values"] == metric.samples["values"]
            assert other.samples["margins"] == pytest.approx(metric.samples["margins"], abs=1e-4)
            assert other.protocol["scorer"] == "shared_context" and "scorer" not in metric.protocol


def test_unknown_scorer_is_a_config_error():
    from prunelab.errors import ConfigError
    from prunelab.evaluation.zeroshot import ZeroShotSpec

    with pytest.raises(ConfigError, match="lm_eval, shared_context"):
        ZeroShotSpec(tasks=("tb_city",), scorer="fast")


def test_choices_that_change_the_context_share_its_beginning():
    """WinoGrande's shape: two contexts (the option filled in) before one continuation share the
    tokens before the option; only the continuation is scored."""
    from prunelab.evaluation.shared_context import _groups

    requests = [(("", ""), [5, 6, 7, 8], [9, 10]), (("", ""), [5, 6, 11], [9, 10]),  # one item
                (("", ""), [1, 2], [3]), (("", ""), [1, 2], [4, 4]),  # one context, two choices
                (("", ""), [7], [12]), (("", ""), [8], [12])]  # nothing shared: HFLM's loop
    groups, alone = _groups(requests, max_length=32)
    by_prefix = {tuple(g.prefix): g for g in groups}
    assert set(by_prefix) == {(1, 2), (5, 6)} and alone == [4, 5]
    winogrande = by_prefix[(5, 6)]
    assert winogrande.remainders == [[7, 8, 9, 10], [11, 9, 10]] and winogrande.scored == [2, 2]
    assert by_prefix[(1, 2)].remainders == [[3], [4, 4]] and by_prefix[(1, 2)].scored == [1, 2]
    assert _groups(requests, max_length=3)[1] == [0, 1, 4, 5]  # too long for the window: HFLM truncates
