"""A scikit-learn random forest trained on cloud threads through joblib (seed §3.4.4).

The seed ported Smile's random forest by changing 378 lines of the library. Here the library
is unchanged: scikit-learn already parallelizes its trees with joblib, and `import
spindle.joblib` registers a joblib backend named "spindle", so the trees of
`RandomForestClassifier(n_jobs=-1)` are built by Spindle functions.

    spindle run examples/random_forest.py [--samples 20000] [--features 40] [--trees 100]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import joblib
from sklearn.datasets import make_classification
from sklearn.ensemble import RandomForestClassifier
from sklearn.model_selection import train_test_split

import spindle
import spindle.joblib  # noqa: F401  (registers the "spindle" joblib backend)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--features", type=int, default=40)
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--local", action="store_true", help="joblib's default backend instead")
    ap.add_argument("--json", action="store_true", help="also print the result as JSON")
    args = ap.parse_args()

    x, y = make_classification(n_samples=args.samples, n_features=args.features,
                               n_informative=args.features // 2, n_classes=args.classes,
                               random_state=args.seed)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25,
                                                        random_state=args.seed)
    forest = RandomForestClassifier(n_estimators=args.trees, n_jobs=-1, random_state=args.seed)
    backend = "loky" if args.local else "spindle"
    print(f"{args.trees} trees on {len(x_train):,} samples x {args.features} features, "
          f"joblib backend {backend!r}", file=sys.stderr)

    if not args.local:
        spindle.connect()
    start = time.perf_counter()
    with joblib.parallel_backend(backend):
        forest.fit(x_train, y_train)  # unchanged scikit-learn code
    elapsed = time.perf_counter() - start

    accuracy = forest.score(x_test, y_test)
    print(f"trained {len(forest.estimators_)} trees in {elapsed:.2f} s; test accuracy "
          f"{accuracy:.3f} ({args.classes} classes, chance {1 / args.classes:.3f})")
    if args.json:
        print(json.dumps({"accuracy": accuracy, "seconds": elapsed, "trees": len(forest.estimators_),
                          "classes": args.classes, "backend": backend}))


if __name__ == "__main__":
    main()
