"""`python -m prunelab.data.tokenize_child`: tokenize one text for `tokens.encode` in a process of
its own, so that the encoding's heap is returned to the OS when it exits.

stdin: a pickle of (tokenizer, text) from the parent; stdout: the [1, L] int64 ids as a .npy file.
Run as a module (not multiprocessing's spawn) so that the parent's main script is never imported
again in the child.
"""

from __future__ import annotations

import pickle
import sys

import numpy as np


def main() -> None:
    tokenizer, text = pickle.loads(sys.stdin.buffer.read())
    ids = tokenizer(text, return_tensors="np", verbose=False).input_ids  # [1, L]
    np.save(sys.stdout.buffer, np.asarray(ids, dtype=np.int64), allow_pickle=False)


if __name__ == "__main__":
    main()
