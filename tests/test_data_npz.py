"""gedl_jax.data.npz: a user's dataset in one .npz file, checked array by array, split like the
built-in sets, and usable by the device input pipeline (uint8 or float32 Splits)."""

import re

import jax.numpy as jnp
import numpy as np
import pytest

from gedl_jax import data
from gedl_jax.data import npz

K = 4


def _arrays(n_train=40, n_test=12, shape=(6, 6, 1), dtype=np.uint8, seed=0, val=False):
    rng = np.random.default_rng(seed)

    def images(n):
        if dtype == np.uint8:
            return rng.integers(0, 256, (n, *shape), dtype=np.uint8)
        return rng.uniform(0, 1, (n, *shape)).astype(dtype)

    out = {"train_images": images(n_train), "train_labels": np.arange(n_train) % K,
           "test_images": images(n_test), "test_labels": np.arange(n_test) % K}
    if val:
        out.update(val_images=images(8), val_labels=np.arange(8) % K)
    return out


def _write(tmp_path, arrays, name="mine.npz"):
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


# --------------------------------------------------------------------------- valid files
def test_uint8_images_with_a_validation_set(tmp_path):
    arrays = _arrays(val=True)
    path = _write(tmp_path, arrays)
    ds = data.read_npz(path)
    assert (ds.name, ds.num_classes, ds.input_shape) == ("mine", K, (6, 6, 1))
    for split, key in (("train", "train"), ("test", "test"), ("validation", "val")):
        s = getattr(ds, split)
        assert (s.name, s.source, s.images.dtype, s.labels.dtype) == (
            f"mine/{split}", "npz", np.uint8, np.int32)
        np.testing.assert_array_equal(s.images, arrays[f"{key}_images"])
        np.testing.assert_array_equal(s.labels, arrays[f"{key}_labels"])
    splits = data.load_npz_train_val_test(path, seed=3)
    assert set(splits) == {"train", "validation", "test"}
    np.testing.assert_array_equal(splits["validation"].images, arrays["val_images"])  # kept
    np.testing.assert_array_equal(splits["train"].images, arrays["train_images"])


def test_without_validation_arrays_the_split_is_the_protocols_seeded_cut(tmp_path):
    arrays = _arrays(n_train=50)
    path = _write(tmp_path, arrays)
    splits = data.load_npz_train_val_test(path, seed=7, val_fraction=0.2)
    tr, va = data.split_indices(50, 0.2, 7)       # what the built-in sets' official split gets
    assert (len(splits["train"]), len(splits["validation"])) == (40, 10)
    np.testing.assert_array_equal(splits["train"].images, arrays["train_images"][tr])
    np.testing.assert_array_equal(splits["validation"].labels, arrays["train_labels"][va])
    assert splits["train"].name == "mine/train" and splits["validation"].name == "mine/validation"
    other = data.load_npz_train_val_test(path, seed=8, val_fraction=0.2)
    assert not np.array_equal(other["validation"].labels, splits["validation"].labels) or \
        not np.array_equal(other["validation"].images, splits["validation"].images)


def test_float_images_and_vectors_become_float32_splits(tmp_path):
    images = _arrays(dtype=np.float64)            # floating, not float32: converted
    ds = data.read_npz(_write(tmp_path, images, "f.npz"))
    assert ds.train.images.dtype == np.float32
    np.testing.assert_allclose(ds.train.images, images["train_images"], rtol=1e-7)
    vectors = _arrays(shape=(13,), dtype=np.float32)
    vectors["train_images"] *= 50.0               # vectors need not lie in [0, 1]
    ds = data.read_npz(_write(tmp_path, vectors, "v.npz"))
    assert ds.input_shape == (13,) and ds.train.images.dtype == np.float32
    # The device pipeline takes float Splits as they are: batches, [0, 1] scaling only for uint8.
    order = jnp.arange(len(ds.train), dtype=jnp.int32)
    x, y = data.take_batch(ds.train.images, ds.train.labels, order, 1, 8)
    np.testing.assert_array_equal(data.to_float(x), vectors["train_images"][8:16])
    np.testing.assert_array_equal(y, vectors["train_labels"][8:16])
    mean, _ = data.channel_stats(ds.train)        # per feature, not divided by 255
    np.testing.assert_allclose(mean, vectors["train_images"].mean(0), rtol=1e-5)
    assert len(ds.train.take(np.arange(5))) == 5 and len(ds.train.subset(4)) == 4


def test_ood_sets(tmp_path):
    ds = data.read_npz(_write(tmp_path, _arrays()))
    ood_arrays = {"test_images": np.zeros((9, 6, 6, 1), np.uint8)}
    ood = data.load_npz_ood(_write(tmp_path, ood_arrays, "ood.npz"), like=ds.train)
    assert (ood.name, len(ood), ood.source) == ("ood/test", 9, "npz")
    np.testing.assert_array_equal(ood.labels, 0)                 # no labels: zeros
    labelled = {**ood_arrays, "test_labels": np.arange(9) + 20}  # other classes are fine
    ood = data.load_npz_ood(_write(tmp_path, labelled, "ood2.npz"), like=(6, 6, 1), name="x")
    assert ood.name == "x" and ood.labels.max() == 28
    # A full dataset file serves as an OOD set too (its test arrays).
    assert len(data.load_npz_ood(_write(tmp_path, _arrays(seed=1), "other.npz"), ds.train)) == 12


def test_parse_spec():
    assert npz.parse_spec("npz:~/d/x.npz").name == "x.npz"
    assert npz.parse_spec("mnist") is None
    with pytest.raises(ValueError, match="expected 'npz:<path"):
        npz.parse_spec("npz:")


# ------------------------------------------------------------------------------- errors
def _set(**changes):
    def mutate(arrays):
        for key, value in changes.items():
            if value is None:
                arrays.pop(key)
            else:
                arrays[key] = value(arrays) if callable(value) else value
        return arrays
    return mutate


BAD = [
    ("missing key", _set(train_labels=None),
     r"missing array\(s\) 'train_labels'; found \['test_images', 'test_labels', "
     r"'train_images'\]"),
    ("val without labels", _set(val_images=np.zeros((3, 6, 6, 1), np.uint8)),
     r"'val_images' without 'val_labels'; give both or neither"),
    ("3-d images", _set(train_images=lambda a: a["train_images"][..., 0]),
     r"'train_images' has shape \(40, 6, 6\) \(3 dimensions\); expected \(N, H, W, C\) images "
     r"or \(N, D\) vectors \(grayscale images need a channel axis"),
    ("5-d images", _set(test_images=lambda a: a["test_images"][..., None]),
     r"'test_images' has shape \(12, 6, 6, 1, 1\) \(5 dimensions\)"),
    ("int64 images", _set(train_images=lambda a: a["train_images"].astype(np.int64)),
     r"'train_images' has dtype int64; expected uint8 images \(0..255\) or float32"),
    ("bool images", _set(test_images=lambda a: a["test_images"] > 100),
     r"'test_images' has dtype bool"),
    ("uint8 vectors", _set(train_images=np.zeros((40, 5), np.uint8),
                           test_images=np.zeros((12, 5), np.uint8)),
     r"'train_images' is uint8 \(N, D\) = \(40, 5\); vectors must be floating"),
    ("float images above 1", _set(train_images=lambda a: a["train_images"].astype(np.float32)),
     r"'train_images' are float images with values in \[0, 255\]; expected \[0, 1\]"),
    ("float images below 0", _set(test_images=np.full((12, 6, 6, 1), -0.5, np.float32)),
     r"'test_images' are float images with values in \[-0.5, -0.5\]"),
    ("NaN images", _set(train_images=lambda a: np.where(
        np.arange(40)[:, None, None, None] == 17, np.nan, a["train_images"] / 255.0)),
     r"'train_images' holds NaN or inf values in 1 example\(s\) \(first: index 17\)"),
    ("inf vectors", _set(train_images=np.ones((40, 3), np.float32),
                         test_images=np.array([[1.0, np.inf, 0.0]] * 12, np.float32)),
     r"'test_images' holds NaN or inf values in 12 example\(s\) \(first: index 0\)"),
    ("empty training set", _set(train_images=np.zeros((0, 6, 6, 1), np.uint8),
                                train_labels=np.zeros(0, np.int64)),
     r"'train_images' holds no examples \(shape \(0, 6, 6, 1\)\)"),
    ("float labels", _set(train_labels=lambda a: a["train_labels"].astype(np.float32)),
     r"'train_labels' has dtype float32; expected integer class indices 0..K-1"),
    ("one-hot labels", _set(test_labels=lambda a: np.eye(K, dtype=np.int64)[a["test_labels"]]),
     r"'test_labels' has shape \(12, 4\); expected \(N,\) class indices"),
    ("negative labels", _set(train_labels=lambda a: a["train_labels"] - 1),
     r"'train_labels' holds negative labels \(min -1\)"),
    ("length mismatch", _set(train_labels=lambda a: a["train_labels"][:-1]),
     r"'train_labels' has 39 labels but 'train_images' has 40 examples"),
    ("absent class", _set(train_labels=lambda a: np.where(a["train_labels"] == 2, 3,
                                                          a["train_labels"])),
     r"'train_labels' run to 3 \(K = 4\) but class\(es\) 2 never occur; labels must be 0..K-1 "
     r"with every class in the training set"),
    ("one class", _set(train_labels=np.zeros(40, np.int64), test_labels=np.zeros(12, np.int64)),
     r"'train_labels' hold one class \(0\); a classifier needs at least 2"),
    ("test label beyond K", _set(test_labels=lambda a: a["test_labels"] + 1),
     r"'test_labels' hold label 4, outside the training classes 0..3"),
    ("test shape", _set(test_images=np.zeros((12, 7, 6, 1), np.uint8)),
     r"'test_images' examples have shape \(7, 6, 1\) but 'train_images' examples have "
     r"\(6, 6, 1\)"),
    ("val shape", _set(val_images=np.zeros((8, 6, 6, 3), np.uint8),
                       val_labels=np.arange(8) % K),
     r"'val_images' examples have shape \(6, 6, 3\) but 'train_images' examples have "
     r"\(6, 6, 1\)"),
    ("val label beyond K", _set(val_images=np.zeros((8, 6, 6, 1), np.uint8),
                                val_labels=np.arange(8)),
     r"'val_labels' hold label 7, outside the training classes 0..3"),
]


@pytest.mark.parametrize("mutate,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_each_problem_is_one_line_naming_the_file_and_array(tmp_path, mutate, message):
    path = _write(tmp_path, mutate(_arrays()))
    with pytest.raises(data.CorruptDataError, match=re.escape(str(path)) + ": " + message) \
            as info:
        data.load_npz_train_val_test(path)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, data.DataError)


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(data.MissingDataError, match=r"nothere.npz: no such .npz file"):
        data.read_npz(tmp_path / "nothere.npz")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip file at all")
    with pytest.raises(data.CorruptDataError, match=r"junk.npz: cannot read it as an .npz file "
                                                     r"\(\w+Error: "):
        data.read_npz(junk)
    pickled = tmp_path / "objects.npz"
    np.savez(pickled, train_images=np.array([{"a": 1}], dtype=object))
    with pytest.raises(data.CorruptDataError, match=r"objects.npz: cannot read it as an .npz"):
        data.read_npz(pickled)


def test_ood_errors(tmp_path):
    like = (6, 6, 1)
    wrong = _write(tmp_path, {"test_images": np.zeros((5, 28, 28, 1), np.uint8)}, "o1.npz")
    with pytest.raises(data.CorruptDataError,
                       match=r"o1.npz: OOD 'test_images' examples have shape \(28, 28, 1\) but "
                             r"the in-distribution examples have \(6, 6, 1\): an OOD set must "
                             r"have the same shape"):
        data.load_npz_ood(wrong, like=like)
    no_images = _write(tmp_path, {"images": np.zeros((5, 6, 6, 1), np.uint8)}, "o2.npz")
    with pytest.raises(data.CorruptDataError, match=r"o2.npz: missing array\(s\) 'test_images'"):
        data.load_npz_ood(no_images, like=like)
    bad_labels = _write(tmp_path, {"test_images": np.zeros((5, 6, 6, 1), np.uint8),
                                   "test_labels": -np.ones(5, np.int64)}, "o3.npz")
    with pytest.raises(data.CorruptDataError, match=r"o3.npz: 'test_labels' holds negative"):
        data.load_npz_ood(bad_labels, like=like)
    nan = _write(tmp_path, {"test_images": np.full((5, 6, 6, 1), np.nan, np.float32)}, "o4.npz")
    with pytest.raises(data.CorruptDataError, match=r"o4.npz: 'test_images' holds NaN"):
        data.load_npz_ood(nan, like=like)


def test_split_accepts_float32_arrays_and_still_refuses_other_images():
    data.Split(np.zeros((3, 5), np.float32), np.zeros(3, np.int32), "v")
    data.Split(np.zeros((3, 4, 4, 2), np.float32), np.zeros(3, np.int32), "f")
    for images in (np.zeros((3, 5), np.uint8), np.zeros((3, 4, 4, 1), np.float64),
                   np.zeros((3, 4, 4), np.float32)):
        with pytest.raises(data.CorruptDataError, match="images must be N x H x W x C uint8, "
                                                        "or float32"):
            data.Split(images, np.zeros(3, np.int32), "x")
