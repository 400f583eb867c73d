"""A user's plugin: an MLP trained here on scikit-learn's breast-cancer data, offered in
int8 (dynamic quantization) with the accuracy it may lose stated. Its `config` records its
width, as metadata only: there is no `variant` to build another (its checkpoint records
the config, which loading it gives back unchanged). It takes domain-native items too: a
CSV row of the 30 raw measurements (`zoo predict mlp.cancer "17.99,10.38,..."`), answered
with a diagnosis."""

import numpy as np
import torch

import zoo

FEATURES = 30
HIDDEN = 32


def load(split):
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    x, y = load_breast_cancer(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)  # standardized by the training split alone
    x, y = (x_train, y_train) if split == "train" else (x_test, y_test)
    return {"features": ((x - mean) / std).astype(np.float32)}, y.astype(np.int64)


def standardization():
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    x, y = load_breast_cancer(return_X_y=True)
    x_train = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)[0]
    return x_train.mean(axis=0), x_train.std(axis=0)


def preprocess(items):
    """CSV rows of the raw measurements -> standardized features."""
    rows = []
    for k, item in enumerate(items, 1):
        try:
            row = [float(v) for v in item.decode().split(",")]
        except ValueError:
            raise zoo.InputError(f"row {k} is not {FEATURES} comma-separated numbers") from None
        if len(row) != FEATURES:
            raise zoo.InputError(f"row {k} has {len(row)} values; it takes {FEATURES}")
        rows.append(row)
    mean, std = standardization()
    return {"features": ((np.array(rows) - mean) / std).astype(np.float32)}


def postprocess(outputs):
    """scikit-learn's targets: 0 malignant, 1 benign."""
    logits = outputs["logits"].astype(np.float64)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return [{"diagnosis": ("malignant", "benign")[int(i)], "probability": round(float(row[i]), 4)}
            for row, i in zip(p, p.argmax(axis=1))]


def build():
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 2))


def accuracy(outputs, targets):
    return float((outputs["logits"].argmax(axis=1) == targets).mean())


@zoo.hookimpl
def zoo_register_models(register):
    register(zoo.ModelSpec(
        name="mlp.cancer", domain="tabular", task="classification",
        inputs=(zoo.TensorSpec("features", "float32", ("batch", FEATURES)),),
        outputs=(zoo.TensorSpec("logits", "float32", ("batch", 2)),),
        build=build, config={"hidden": HIDDEN},
        sample=lambda batch, rng: {"features": load("test")[0]["features"][rng.integers(0, 143, batch)]},
        axes={"batch": zoo.AxisRange(1, 8, 64)},
        dataset=zoo.Dataset("scikit-learn breast cancer: 569 tumours, 30 features, 75/25 split", load),
        loss=lambda outputs, targets: torch.nn.functional.cross_entropy(outputs["logits"], targets),
        metric=zoo.Metric("accuracy", accuracy),
        recipe=zoo.Recipe(epochs=20, batch_size=32, lr=1e-2, weight_decay=1e-4, target=0.95),
        quantization="dynamic", raw_kind="csvrow", preprocess=preprocess, postprocess=postprocess,
        tolerances={"fp32": zoo.Tolerance(1e-4, 1e-4), "int8": zoo.Tolerance(0.5, 0.1, metric_drop=0.02)}))
