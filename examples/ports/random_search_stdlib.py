"""A scikit-learn randomized hyper-parameter search whose fits run in parallel through
joblib (seeded: the same search in every run, whichever backend runs the fits)."""

from joblib import parallel_config
from sklearn.datasets import make_classification
from sklearn.ensemble import RandomForestClassifier
from sklearn.model_selection import RandomizedSearchCV


def main():
    X, y = make_classification(n_samples=300, n_features=12, n_informative=6, random_state=0)
    search = RandomizedSearchCV(
        RandomForestClassifier(random_state=0),
        {"n_estimators": [5, 10, 20, 40], "max_depth": [2, 4, 8, None],
         "min_samples_leaf": [1, 2, 4]},
        n_iter=6, cv=3, random_state=0, n_jobs=2,
    )
    with parallel_config(n_jobs=2):
        search.fit(X, y)
    for params, score in sorted(zip(map(str, search.cv_results_["params"]),
                                    search.cv_results_["mean_test_score"])):
        print(f"{params}: {score:.4f}")
    print(f"best: {search.best_params_} {search.best_score_:.4f}")


if __name__ == "__main__":
    main()
