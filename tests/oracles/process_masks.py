"""Prune a plainly loaded model in a process of its own and print a hash of its masks.

    python tests/oracles/process_masks.py --side prunelab|oracle --method ria --folder DIR \
        --ids IDS.pt --layers 2 --threads 1 [--sparsity-type 2:4]

The model comes from `AutoModelForCausalLM.from_pretrained(DIR)` with nothing set, as a user's
script loads it (its weights stay where transformers puts them, not realigned by a deep copy); the
calibration token ids ([N, T]) come from a file, so that `--side oracle` imports nothing from
prunelab (it checks). Prints one JSON line: the sha256 over every decoder linear's zero pattern in
order, per-linear digests, the digests of RIA's score matrices (prunelab's `ria_scores`, the
oracle's `relative_importance_metric`; sorted, since the two visit a layer's linears in their own
orders), the fraction pruned and the thread count used. Equal score digests mean equal scores to
the last bit: a statistic or a sum taken in another order changes them even where no mask entry
flips.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch


def recording(score_function, digests: list[str]):
    """`score_function`, also appending a digest of each result's bits to `digests`."""
    def scored(*args, **kwargs):
        result = score_function(*args, **kwargs)
        digests.append(hashlib.sha256(result.detach().float().numpy().tobytes()).hexdigest()[:16])
        return result
    return scored


def mask_digests(model) -> dict[str, str]:
    return {name: hashlib.sha256((p.detach() == 0).numpy().tobytes()).hexdigest()[:16]
            for name, p in model.model.layers.named_parameters() if p.dim() == 2}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=["prunelab", "oracle"], required=True)
    parser.add_argument("--method", default="ria")
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--ids", type=Path, required=True, help="torch.save'd calibration token ids [N, T]")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sparsity-type", default="unstructured")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.folder)
    token_ids = torch.load(args.ids)
    model = AutoModelForCausalLM.from_pretrained(args.folder)
    model.model.layers = torch.nn.ModuleList(list(model.model.layers)[:args.layers])
    model.config.num_hidden_layers = args.layers
    scores: list[str] = []  # a digest of every score matrix, to the last bit, in the order computed
    if args.side == "prunelab":
        import prunelab
        from prunelab.pruning import ria

        ria.ria_scores = recording(ria.ria_scores, scores)
        prunelab.prune(model, tokenizer, method=args.method, calibration=token_ids, progress=False,
                       sparsity_type=args.sparsity_type)
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from oracles import ORACLES
        from oracles import ria

        ria.relative_importance_metric = recording(ria.relative_importance_metric, scores)

        nm = None if args.sparsity_type == "unstructured" else tuple(map(int, args.sparsity_type.split(":")))
        ORACLES[args.method](model, token_ids, sparsity=0.5, nm=nm)
        leaked = sorted(name for name in sys.modules if name.split(".")[0] == "prunelab")
        if leaked:
            raise SystemExit(f"the oracle side imported prunelab: {leaked[:3]}")
    digests = mask_digests(model)
    whole = hashlib.sha256("".join(digests.values()).encode()).hexdigest()
    linears = [p for p in model.model.layers.parameters() if p.dim() == 2]
    pruned = sum(int((p == 0).sum()) for p in linears) / sum(p.numel() for p in linears)
    print(json.dumps({"hash": whole, "per_linear": digests, "scores": sorted(scores),
                      "threads": torch.get_num_threads(), "pruned": pruned}))


if __name__ == "__main__":
    main()
