"""Small commands beside the Hydra run, dispatched by `prunelab.cli` (`prunelab <command> ...`).

They sit at the top with the CLI because they compose presets (`prunelab.config`) and load models;
the probes and methods they call stay below and know nothing of them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict


def activations(argv: list[str] | None = None) -> None:
    """`prunelab activations MODEL...`: the massive-activation profile of each model preset, one JSON
    line each (`prunelab.probes.activations`)."""
    from prunelab.config import model_preset
    from prunelab.data import CalibrationSpec, calibration_samples
    from prunelab.errors import ConfigError
    from prunelab.models import load_model
    from prunelab.probes import activations as probe
    from prunelab.probes.activations import profile, summary

    parser = argparse.ArgumentParser(prog="prunelab activations", description=probe.__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="options of the model config group")
    parser.add_argument("--source", default="realtext", help="calibration source of the token windows")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--json", action="store_true", help="print every state's profile as JSON")
    args = parser.parse_args(argv)
    for name in args.models:
        try:
            spec = model_preset(name, device="cpu")
        except ConfigError as error:
            parser.error(str(error))
        loaded = load_model(spec)
        windows = CalibrationSpec(source=args.source, nsamples=args.samples,
                                  seqlen=min(args.seqlen, loaded.config.max_position_embeddings))
        profiles = profile(loaded.adapter, calibration_samples(windows, loaded.tokenizer, seed=0))
        print(json.dumps({"model": name, "tokens": args.samples * windows.seqlen, "source": args.source,
                          **summary(profiles),
                          **({"states": [asdict(p) for p in profiles]} if args.json else {})}))
