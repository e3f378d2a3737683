"""Beyond numeric columns (Spark local[2], data made offline): PNG bytes, text and
variable-length arrays through a transformFn on the ranks, on the driver and in
TorchModel.transform; and the errors when it goes wrong."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from sparkddl import DataError, SparkDDLError, TorchEstimator, TorchModel, TrainingFailedError
from sparkddl.transforms import decode_images
from tests.integration.digits import _arrays

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
NOISE = ["the", "a", "number", "is", "maybe", "surely"]
VOCAB = {w: i for i, w in enumerate(["<unknown>", *NOISE, *WORDS])}


def png(row: np.ndarray) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray((row.reshape(8, 8) * 255).round().astype(np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def png_digits():
    x, y = _arrays()
    return [(bytearray(png(r)), int(label), i % 5) for i, (r, label) in enumerate(zip(x, y))]


def cnn() -> torch.nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
                                   torch.nn.Flatten(), torch.nn.Linear(16 * 64, 10))


def mlp(inputs: int) -> torch.nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(inputs, 64), torch.nn.ReLU(),
                                   torch.nn.Linear(64, 10))


def estimator(store, model, features, transform, **params) -> TorchEstimator:
    base = dict(model=model, optimizer=lambda p: torch.optim.Adam(p, lr=3e-3),
                loss=torch.nn.CrossEntropyLoss(), featuresCol=features, labelCol="label",
                batchSize=32, epochs=10, numWorkers=2, validation=0.2, store=str(store),
                progress=False, transformFn=transform, maxRestarts=1)
    return TorchEstimator(**{**base, **params})


def accuracy(model, test, column="label") -> float:
    rows = model.transform(test).select(column, "prediction").collect()
    return sum(r[column] == r["prediction"] for r in rows) / len(rows)


@pytest.mark.timeout(300)
def test_png_bytes_decoded_on_the_ranks_train_a_cnn(spark_local, png_digits, tmp_path):
    df = spark_local.createDataFrame(png_digits, "png binary, label int, split int")
    train, test = df.filter("split != 0"), df.filter("split = 0")
    model = estimator(tmp_path / "st", cnn(), "png", decode_images).fit(train)
    assert accuracy(model, test) >= 0.9
    assert [s.shape for s in model.input_specs] == [(1, 8, 8)]  # after the transform
    # saved with it: sparkddl's own transform is rebuilt by import, with no trust
    model.write().overwrite().save(str(tmp_path / "model"))
    again = TorchModel.load(str(tmp_path / "model"))
    assert again._transform_fn is decode_images
    assert accuracy(again, test) == accuracy(model, test)


@pytest.mark.timeout(300)
def test_png_and_ragged_arrays_in_a_parquet_table_are_read_in_place(spark_local, png_digits,
                                                                    tmp_path):
    x, _ = _arrays()
    ragged = [x[i][:int(np.nonzero(x[i])[0].max()) + 1].tolist() for i in range(len(x))]
    rows = [(p, r, label, s) for (p, label, s), r in zip(png_digits, ragged)]
    spark_local.createDataFrame(rows, "png binary, pixels array<float>, label int, split int") \
        .write.parquet(str(tmp_path / "table"))
    table = spark_local.read.parquet(str(tmp_path / "table"))

    def both(batch):
        return {**decode_images({"png": batch["png"]}), **pad({"pixels": batch["pixels"]})}

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.image, self.pixels = cnn(), mlp(64)

        def forward(self, png, pixels):
            return self.image(png) + self.pixels(pixels)

    # a filter would make Spark compute rows, so the whole table is trained on (in place)
    model = estimator(tmp_path / "st", Two(), ["png", "pixels"], both,
                      validation=None).fit(table.select("png", "pixels", "label"))
    assert not (tmp_path / "st" / "data").exists()  # read where it is, nothing materialized
    assert accuracy(model, table) >= 0.9  # training accuracy: both inputs went through


def tokens(batch):
    """Each text as 6 token ids of a fixed vocabulary (int64, 0 pads and unknown words)."""
    out = np.zeros((len(batch["text"]), 6), dtype=np.int64)
    for i, text in enumerate(batch["text"]):
        ids = [VOCAB.get(word, 0) for word in text.lower().split()][:6]
        out[i, :len(ids)] = ids
    return {"text": out}


class Bag(torch.nn.Module):
    """Token ids -> the mean of their embeddings -> classes."""

    def __init__(self):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.embed = torch.nn.Embedding(len(VOCAB), 16)
            self.out = torch.nn.Linear(16, 10)

    def forward(self, ids):
        return self.out(self.embed(ids).mean(1))


@pytest.mark.timeout(300)
def test_a_text_column_tokenized_in_the_transform(spark_local, tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(1500):
        label = int(rng.integers(10))
        noise = rng.choice(NOISE, size=3)
        rows.append((" ".join([*noise[:2], WORDS[label], noise[2]]), label, i % 5))
    df = spark_local.createDataFrame(rows, "text string, label int, split int")
    train, test = df.filter("split != 0"), df.filter("split = 0")
    model = estimator(tmp_path / "st", Bag(), "text", tokens, epochs=8,
                      optimizer=lambda p: torch.optim.Adam(p, lr=1e-2)).fit(train)
    # token ids stay int64 from the transform to the embedding, in training and in transform
    assert [(s.shape, s.dtype) for s in model.input_specs] == [((6,), "int64")]
    assert accuracy(model, test) >= 0.9
    # a function of the application's is saved by name (a notebook's, pickled): loading it
    # runs code, so it needs trust, or the function given back
    model.write().overwrite().save(str(tmp_path / "model"))
    with pytest.raises(SparkDDLError, match="has a transformFn that imports "
                                            "'tests.integration.test_raw_columns:tokens'"):
        TorchModel.load(str(tmp_path / "model"))
    again = TorchModel.load(str(tmp_path / "model"), transformFn=tokens)
    assert again.program() is not None  # exported with its int64 input
    assert accuracy(again, test) == accuracy(model, test)


def pad(batch):
    """Variable-length pixel rows (trailing zeros dropped) padded back to 64 values."""
    out = np.zeros((len(batch["pixels"]), 64), dtype=np.float32)
    for i, row in enumerate(batch["pixels"]):
        out[i, :len(row)] = row
    return {"pixels": out}


@pytest.mark.timeout(300)
def test_variable_length_arrays_padded_in_the_transform(spark_local, tmp_path):
    x, y = _arrays()
    rows = []
    for i, (r, label) in enumerate(zip(x, y)):
        last = int(np.nonzero(r)[0].max()) + 1
        rows.append((r[:last].tolist(), int(label), i % 5))
    assert len({len(r[0]) for r in rows}) > 5  # lengths really vary
    df = spark_local.createDataFrame(rows, "pixels array<float>, label int, split int")
    train, test = df.filter("split != 0"), df.filter("split = 0")
    model = estimator(tmp_path / "st", mlp(64), "pixels", pad).fit(train)
    assert accuracy(model, test) >= 0.9
    # the same arrays without a transform: refused on the driver, saying why
    with pytest.raises(DataError, match="unequal length"):
        estimator(tmp_path / "st", mlp(64), "pixels", None).fit(train)


def test_bytes_without_a_transform_are_refused_on_the_driver(spark_local, png_digits,
                                                             tmp_path):
    df = spark_local.createDataFrame(png_digits[:200], "png binary, label int, split int")
    with pytest.raises(DataError, match=r"'png' \(binary\) hold bytes or text, which become "
                                        r"tensors only through a transformFn"):
        estimator(tmp_path / "st", cnn(), "png", None).fit(df)


WHITE = png(np.ones(64, dtype=np.float32))


def sometimes_fails(batch):
    out = decode_images(batch)
    if (out["png"].reshape(len(out["png"]), -1).min(1) == 1.0).any():  # a white square
        raise ValueError("cannot decode this one")
    return out


def odd_shapes(batch):
    out = decode_images(batch)
    if (out["png"].reshape(len(out["png"]), -1).min(1) == 1.0).any():
        out["png"] = out["png"][:, :, :4, :4]
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fn,match", [
    (sometimes_fails, r"TransformError: transformFn failed on rank \d, epoch \d+, batch \d+: "
                      r"ValueError: cannot decode this one"),
    (odd_shapes, r"TransformError: transformFn returned 'png' as float32 rows of shape "
                 r"\(1, 4, 4\) \(rank \d, epoch \d+, batch \d+\), but float32 rows of shape "
                 r"\(1, 8, 8\) before"),
])
def test_a_failing_transform_names_the_rank_and_batch_and_is_not_retried(
        spark_local, png_digits, tmp_path, fn, match):
    # 40 white squares after the digits: the driver's sample (the first rows) is clean
    rows = png_digits + [(bytearray(WHITE), 0, 1)] * 40
    df = spark_local.createDataFrame(rows, "png binary, label int, split int")
    with pytest.raises(TrainingFailedError, match=match) as err:
        estimator(tmp_path / "st", cnn(), "png", fn, epochs=2, validation=None).fit(df)
    assert "not retried" in str(err.value)
