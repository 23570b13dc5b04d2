"""CIFAR-10-C regenerator (gedl_jax.data.corruptions), on small generated arrays.

Each corruption is checked against an independent reference: Pillow's own calls (pixelate,
jpeg), exact moments from the Poisson / normal laws with the release's truncation (shot and
gaussian noise), the closed forms of brightness and contrast, the standard library's colorsys
(HSV), and the on-disk layout read back by the existing CIFAR-10-C reader and load_corrupted.
"""

import colorsys
import json

import numpy as np
import pytest
from data_fixtures import cifar10c_arrays, specs_for, write_cifar10c_folder, write_npz
from PIL import Image
from scipy import stats

from gedl_jax import data
from gedl_jax.data import corruptions as C
from gedl_jax.data import regenerate
from gedl_jax.data import readers, registry

SEVERITIES = (1, 2, 3, 4, 5)


def random_images(n=6, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)


def constant_images(value, n=64):
    return np.full((n, 32, 32, 3), value, np.uint8)


# -------------------------------------------------------------------------- every corruption
@pytest.mark.parametrize("name", C.REGENERABLE)
def test_every_corruption_keeps_shape_dtype_and_is_seeded(name):
    x = random_images(3)
    before = x.copy()
    for s in SEVERITIES:
        y = C.corrupt(x, name, s, seed=7)
        assert y.shape == x.shape and y.dtype == np.uint8
        np.testing.assert_array_equal(C.corrupt(x, name, s, seed=7), y)  # reproducible
    np.testing.assert_array_equal(x, before)  # the input is never modified
    assert C.corrupt(x[:0], name, 1).shape == (0, 32, 32, 3)


def test_registry_names_and_what_is_left_out():
    assert set(C.REGENERABLE) == set(registry.CORRUPTION_FILES) - {"frost", "spatter"}
    assert {"snow", "brightness", "pixelate", "shot_noise"} <= set(C.REGENERABLE)
    assert set(C.APPROXIMATE_CORRUPTIONS) == {"snow", "motion_blur", "elastic"}
    assert C.corrupt(random_images(1), "glass_blur", 1).shape == (1, 32, 32, 3)  # file stem
    with pytest.raises(data.DataError, match="frost photographs"):
        C.corrupt(random_images(1), "frost", 1)
    with pytest.raises(data.DataError, match="Canny"):
        C.corrupt(random_images(1), "spatter", 1)
    with pytest.raises(data.DataError, match="unknown"):
        C.corrupt(random_images(1), "rain", 1)
    with pytest.raises(ValueError, match="severity"):
        C.corrupt(random_images(1), "snow", 6)
    with pytest.raises(ValueError, match="32 x 32"):
        C.corrupt(np.zeros((1, 28, 28, 1), np.uint8), "snow", 1)


def test_seeds_and_severities_have_their_own_streams():
    x = constant_images(120, 4)
    a = C.corrupt(x, "gaussian_noise", 2, seed=0)
    assert not np.array_equal(a, C.corrupt(x, "gaussian_noise", 2, seed=1))
    # Severity 4 (sigma .09) is not severity 2's draws (sigma .06) rescaled.
    z2 = C.generator_for("gaussian_noise", 2, 0).normal(size=5)
    z4 = C.generator_for("gaussian_noise", 4, 0).normal(size=5)
    assert not np.allclose(z2, z4)
    assert not np.allclose(C.generator_for("shot_noise", 2, 0).random(5),
                           C.generator_for("gaussian_noise", 2, 0).random(5))


# --------------------------------------------------------------------------------- pixelate
def test_pixelate_is_pillows_box_path_byte_for_byte():
    x = random_images(5, seed=3)
    for s, c in zip(SEVERITIES, (0.95, 0.9, 0.85, 0.75, 0.65)):  # the CIFAR parameters
        n = int(32 * c)
        assert n == (30, 28, 27, 24, 20)[s - 1]
        expected = np.stack([np.asarray(Image.fromarray(img).resize((n, n), Image.BOX)
                                        .resize((32, 32), Image.BOX)) for img in x])
        np.testing.assert_array_equal(C.corrupt(x, "pixelate", s), expected)


def test_jpeg_is_pillows_encode_decode():
    import io

    x = random_images(3, seed=4)
    for s, q in zip(SEVERITIES, (80, 65, 58, 50, 40)):
        expected = []
        for img in x:
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, "JPEG", quality=q)
            expected.append(np.array(Image.open(io.BytesIO(buf.getvalue()))))
        np.testing.assert_array_equal(C.corrupt(x, "jpeg_compression", s), np.stack(expected))


# ------------------------------------------------------------------------------- shot noise
def _truncated_moments(values_255: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    out = np.floor(np.clip(values_255, 0, 255))  # the release's clip then np.uint8
    mean = float(np.sum(probs * out))
    return mean, float(np.sum(probs * (out - mean) ** 2))


@pytest.mark.parametrize("severity", SEVERITIES)
@pytest.mark.parametrize("value", [30, 128, 230])
def test_shot_noise_mean_and_variance_match_the_poisson_law(severity, value):
    c = (500, 250, 100, 75, 50)[severity - 1]
    x_f = value / 255.0
    y = C.corrupt(constant_images(value), "shot_noise", severity, seed=severity).astype(float)
    # Exact moments of trunc(255 min(P / c, 1)), P ~ Poisson(x c), from the pmf (float64).
    k = np.arange(0, int(x_f * c + 12 * np.sqrt(x_f * c) + 20))
    mean, var = _truncated_moments(255.0 * k / c, stats.poisson.pmf(k, x_f * c))
    se = np.sqrt(var / y.size)
    assert abs(y.mean() - mean) < 5 * se
    assert abs(y.var() / var - 1) < 5 * np.sqrt(2 / y.size) + 0.01
    # And the textbook formulas (on [0, 1]): mean x, variance x / c where clipping is negligible,
    # up to the truncation's -1/2 LSB and 1/12 LSB^2.
    if x_f + 4 * np.sqrt(x_f / c) < 1:
        assert abs((y.mean() + 0.5) / 255 - x_f) < 5 * se / 255 + 0.5 / 255
        assert abs(y.var() / 255**2 - x_f / c) < 0.05 * x_f / c + 2 / 255**2


# --------------------------------------------------------------------------- gaussian noise
@pytest.mark.parametrize("severity", SEVERITIES)
def test_gaussian_noise_moments(severity):
    sigma = (0.04, 0.06, 0.08, 0.09, 0.10)[severity - 1]
    value = 128  # 5 sigma from either end: clipping is negligible
    y = C.corrupt(constant_images(value), "gaussian_noise", severity, seed=1).astype(float)
    # trunc(255 (x + sigma Z)) over a normal spread of many LSBs: mean - 1/2 LSB, variance
    # (255 sigma)^2 + 1/12.
    grid = np.arange(-8 * 255 * sigma, 8 * 255 * sigma, 0.01)
    dens = stats.norm.pdf(grid, scale=255 * sigma) * 0.01
    mean, var = _truncated_moments(value + grid, dens / dens.sum())
    assert abs(mean - (value - 0.5)) < 0.01 and abs(var - ((255 * sigma) ** 2 + 1 / 12)) < 0.05
    se = np.sqrt(var / y.size)
    assert abs(y.mean() - mean) < 5 * se
    assert abs(y.var() / var - 1) < 5 * np.sqrt(2 / y.size)


def test_speckle_and_impulse_noise_moments():
    x = constant_images(100, 32)
    y = C.corrupt(x, "speckle_noise", 5, seed=2).astype(float)
    assert abs(y.std() - 100 * 0.2) < 0.5  # x + x N(0, c^2): std x c
    y = C.corrupt(x, "impulse_noise", 5, seed=2)
    changed = y != 100
    assert abs(changed.mean() - 0.07) < 0.005  # amount .07, per element and channel
    assert set(np.unique(y[changed])) <= {0, 255}
    assert abs((y[changed] == 255).mean() - 0.5) < 0.03


# ------------------------------------------------------------------- brightness / contrast
def _rgb_images_with_black(seed=5):
    x = random_images(6, seed)
    x[:, :4, :4] = 0  # V = 0: brightness turns black into grey
    x[:, 4:8, :4] = 255
    x[:, 8:12, :4] = [[200, 200, 10]]  # ties for the maximum
    return x


@pytest.mark.parametrize("severity", SEVERITIES)
def test_brightness_closed_form(severity):
    d = (0.05, 0.1, 0.15, 0.2, 0.3)[severity - 1]
    x = _rgb_images_with_black()
    xf = x / 255.0
    v = xf.max(-1, keepdims=True)
    # H and S unchanged, V <- min(V + d, 1): every channel scales by min(V + d, 1) / V; where
    # V = 0 the pixel becomes grey min(d, 1).
    scaled = np.where(v > 0, xf * np.minimum(v + d, 1) / np.where(v > 0, v, 1), min(d, 1.0))
    expected = np.floor(np.clip(scaled, 0, 1) * 255)
    y = C.corrupt(x, "brightness", severity).astype(float)
    assert np.abs(y - expected).max() <= 1
    # Off by one only where the exact value is an integer and float rounding falls below it
    # (d = .2 = 51/255 makes every max channel such a case), as in the release's HSV path.
    assert (y == expected).mean() > 0.95
    np.testing.assert_array_equal(y[:, :4, :4], np.floor(255 * d))


@pytest.mark.parametrize("severity", SEVERITIES)
def test_contrast_closed_form(severity):
    c = (0.75, 0.5, 0.4, 0.3, 0.15)[severity - 1]
    x = random_images(4, seed=6)
    expected = []
    for img in x / 255.0:
        m = img.reshape(-1, 3).mean(0)
        expected.append(np.floor(np.clip((img - m) * c + m, 0, 1) * 255))
    y = C.corrupt(x, "contrast", severity).astype(float)
    assert np.abs(y - np.stack(expected)).max() <= 1
    assert (y == np.stack(expected)).mean() > 0.999


def test_hsv_conversion_matches_colorsys():
    x = _rgb_images_with_black()[:2] / 255.0
    hsv = C.rgb_to_hsv(x)
    ref = np.array([colorsys.rgb_to_hsv(*p) for p in x.reshape(-1, 3)]).reshape(hsv.shape)
    np.testing.assert_allclose(hsv, ref, atol=1e-12)
    np.testing.assert_allclose(C.hsv_to_rgb(hsv), x, atol=1e-12)
    back = np.array([colorsys.hsv_to_rgb(*p) for p in hsv.reshape(-1, 3)]).reshape(x.shape)
    np.testing.assert_allclose(C.hsv_to_rgb(hsv), back, atol=1e-12)


def test_saturate_scales_saturation():
    x = _rgb_images_with_black()[:2]
    y = C.corrupt(x, "saturate", 1)  # S <- .3 S
    s_in = C.rgb_to_hsv(x / 255.0)[..., 1]
    s_out = C.rgb_to_hsv(y / 255.0)[..., 1]
    bright = x.max(-1) > 60  # where 8-bit quantisation of S is fine
    np.testing.assert_allclose(s_out[bright], 0.3 * s_in[bright], atol=0.03)


# ---------------------------------------------------------------------------------- blurs
def test_blur_kernels_are_normalised_and_right_sized():
    for r, a in C.PARAMETERS["defocus_blur"]:
        k = C.defocus_kernel(r, a)
        assert abs(k.sum() - 1) < 1e-6 and np.allclose(k, k.T) and np.allclose(k, k[::-1])
    g = np.exp(-1 / (2 * 0.4**2))
    np.testing.assert_allclose(C.defocus_kernel(0.3, 0.4),  # disk = one pixel: the 3x3 Gaussian
                               np.outer([g, 1, g], [g, 1, g]) / (1 + 2 * g) ** 2, atol=1e-7)
    for radius, sigma in C.PARAMETERS["motion_blur"]:
        w = C.motion_blur_kernel(radius, sigma)
        assert len(w) == 2 * radius + 1 and abs(w.sum() - 1) < 1e-12
        np.testing.assert_allclose(w[1] / w[0], np.exp(-1 / (2 * sigma**2)))
    assert [len(C.zoom_factors(s)) for s in SEVERITIES] == [7, 12, 16, 21, 26]
    dx, dy = C.motion_blur_offsets(5, 0.0)
    assert list(dx) == [0, 1, 2, 3, 4] and list(dy) == [0, 0, 0, 0, 0]
    dx, dy = C.motion_blur_offsets(5, -90.0)  # snow falls from above: taps go up (y down)
    assert list(dx) == [0, 0, 0, 0, 0] and list(dy) == [0, -1, -2, -3, -4]


@pytest.mark.parametrize("name", ["gaussian_blur", "defocus_blur", "zoom_blur", "glass_blur",
                                  "motion_blur"])
def test_blurs_keep_a_constant_image_within_one_lsb(name):
    x = constant_images(200, 2)
    for s in SEVERITIES:
        y = C.corrupt(x, name, s).astype(int)
        assert np.abs(y - 200).max() <= 1


def test_gaussian_blur_matches_scipy_and_motion_blur_of_a_row_pattern():
    from scipy import ndimage

    x = random_images(2, seed=8)
    ref = np.floor(np.clip(ndimage.gaussian_filter(x / 255.0, (0, 0.7, 0.7, 0), mode="nearest"),
                           0, 1) * 255)
    np.testing.assert_array_equal(C.corrupt(x, "gaussian_blur", 3), ref)
    # An image constant along x is unchanged by a horizontal motion blur.
    rows = np.repeat(random_images(1, seed=9)[:, :, :1], 32, axis=2).astype(float)
    np.testing.assert_allclose(C.motion_blur_batch(rows, 6, 2.0, np.array([0.0])), rows)


def test_fog_fractal_is_normalised():
    f = C.plasma_fractal(3, 2.0, np.random.default_rng(0), size=32)
    assert f.shape == (3, 32, 32)
    np.testing.assert_allclose(f.min((1, 2)), 0)
    np.testing.assert_allclose(f.max((1, 2)), 1)


# ----------------------------------------------------------------------- the on-disk set
@pytest.fixture
def cifar10_root(tmp_path):
    root = tmp_path / "data"
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5, 9])
    write_npz(root / "cifar10" / "test.npz", images, labels)
    with registry.override_file_specs("cifar10", "arrays",
                                      specs_for(root / "cifar10", ["test.npz"])):
        yield root, images, labels


@pytest.mark.usefixtures("no_network", "isolated_env")
def test_regenerated_layout_is_read_back_by_the_release_reader(cifar10_root, tmp_path):
    root, images, labels = cifar10_root
    with pytest.raises(data.MissingDataError, match="python -m gedl_jax.data.regenerate"):
        data.load_corrupted("snow", 1, data_dir=root, tfds_data_dir=tmp_path / "t")
    folder = regenerate.regenerate_cifar10c(
        root, corruptions=["snow", "pixelate", "frosted_glass_blur"], seed=3, num_examples=5)
    assert folder == root / "cifar10_corrupted_regenerated" / "CIFAR-10-C"
    assert sorted(p.name for p in folder.iterdir()) == [
        "glass_blur.npy", "labels.npy", "pixelate.npy", "provenance.json", "snow.npy"]
    raw = np.load(folder / "snow.npy")
    assert raw.shape == (25, 32, 32, 3) and raw.dtype == np.uint8
    kept = [0, 1, 2, 3, 4]  # (i * 6) // 5: evenly spaced, not the first five
    assert list(C.subset_indices(6, 5)) == [0, 1, 2, 3, 4]
    assert list(C.subset_indices(10, 4)) == [0, 2, 5, 7] and len(C.subset_indices(6, 0)) == 6
    np.testing.assert_array_equal(np.load(folder / "labels.npy"),
                                  np.tile(labels[kept], 5).astype(np.uint8))
    images5, labels5 = readers.read_cifar10c_all(folder.parent, "snow")
    for s in SEVERITIES:
        np.testing.assert_array_equal(images5[s - 1], C.corrupt(images[kept], "snow", s, seed=3))
    np.testing.assert_array_equal(labels5, labels[kept])
    split = data.load_corrupted("snow", 4, data_dir=root, tfds_data_dir=tmp_path / "t")
    assert split.source == "regenerated" and split.name == "cifar10_corrupted/snow_4"
    np.testing.assert_array_equal(split.images, images5[3])
    glass = data.load_split("cifar10_corrupted", "frosted_glass_blur_2", data_dir=root,
                            tfds_data_dir=tmp_path / "t")
    assert glass.source == "regenerated"
    meta = json.loads((folder / "provenance.json").read_text())
    assert meta["num_examples"] == 5 and "not the official release" in meta["dataset"]
    assert meta["corruptions"]["snow"]["approximate"] is True
    assert meta["corruptions"]["pixelate"]["approximate"] is False
    assert meta["corruptions"]["snow"]["seed"] == 3
    assert set(meta["corruptions"]["snow"]["library_versions"]) >= {"numpy", "scipy", "Pillow"}
    assert meta["corruptions"]["pixelate"]["parameters_by_severity"] == [0.95, 0.9, 0.85, 0.75,
                                                                         0.65]
    assert "frost" in meta["not_regenerable"]
    assert not list(folder.glob("*.tmp")) and not list(folder.glob(".*"))
    # Another subset would make labels.npy disagree with the files already there.
    with pytest.raises(data.DataError, match="num_examples"):
        regenerate.regenerate_cifar10c(root, corruptions=["brightness"], num_examples=4)
    # The official files win where they are present.
    arrays = cifar10c_arrays(n=4, stems=("snow",))
    write_cifar10c_folder(root / "cifar10_corrupted" / "CIFAR-10-C", arrays)
    official = data.load_corrupted("snow", 4, data_dir=root, tfds_data_dir=tmp_path / "t")
    assert official.source.startswith("extracted")
    np.testing.assert_array_equal(official.images, arrays["snow.npy"][12:16])


@pytest.mark.usefixtures("no_network", "isolated_env")
def test_cli_regenerates_and_reports_errors(cifar10_root, capsys):
    from gedl_jax.commands import regenerate as command

    root, images, _ = cifar10_root
    assert command.main([f"--data_dir={root}", "--corruptions=brightness",
                            "--num_examples=2"]) == 0
    folder = C.regenerated_folder(root)
    np.testing.assert_array_equal(np.load(folder / "brightness.npy")[2:4],
                                  C.corrupt(images[[0, 3]], "brightness", 2))
    assert command.main([f"--data_dir={root}", "--corruptions=frost"]) == 2
    assert "frost photographs" in capsys.readouterr().err


def test_the_loader_knows_exactly_the_corruptions_the_generator_makes():
    from gedl_jax.data import regenerated

    assert regenerated.REGENERABLE == C.REGENERABLE
    assert set(regenerated.NOT_REGENERABLE) == (set(registry.CORRUPTION_FILES.values())
                                                - set(C.FUNCTIONS))
