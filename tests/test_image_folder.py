"""Folders of image files as data (`images:<folder>`, gedl_jax.data.image_folder): the resize
geometry against torchvision's documented Resize + CenterCrop arithmetic, the pixels against
NumPy (exact-size images byte for byte, ITU-R 601-2 luma, colour blocks that a misplaced crop
would show), the file order, the cache, every refusal, the ImageFolder dataset layout, and both
through the run engine (config, OOD set resized to the model's input)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from gedl_jax import config as config_lib
from gedl_jax import configs, data
from gedl_jax.data import image_folder
from gedl_jax.run import experiment


def _save(path, pixels, mode=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.asarray(pixels, np.uint8), mode).save(path)
    return path


def _rgb(rng, h, w):
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


# ------------------------------------------------------------------------------- geometry
def _torchvision_resize_center_crop(w: int, h: int, s: int):
    """torchvision's Resize(s) (short side to s, long side int(s * long / short)) then
    CenterCrop(s) (offsets int(round((size - s) / 2))), as its docs and source state them."""
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = s, int(s * long / short)
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    top, left = int(round((new_h - s) / 2.0)), int(round((new_w - s) / 2.0))
    return (new_w, new_h), (left, top, left + s, top + s)


@pytest.mark.parametrize("s", [8, 28, 32])
def test_crop_box_of_a_square_target_is_torchvisions_resize_and_center_crop(s):
    for w in range(1, 90, 3):
        for h in range(1, 90, 5):
            assert image_folder.crop_box((w, h), (s, s)) == \
                _torchvision_resize_center_crop(w, h, s), (w, h, s)


def test_crop_box_of_any_target_covers_it_and_keeps_the_aspect():
    for w, h, th, tw in [(64, 48, 16, 32), (10, 100, 28, 28), (33, 17, 17, 40), (7, 7, 3, 9)]:
        (new_w, new_h), (left, top, right, bottom) = image_folder.crop_box((w, h), (th, tw))
        assert new_w >= tw and new_h >= th and (right - left, bottom - top) == (tw, th)
        assert 0 <= left and right <= new_w and 0 <= top and bottom <= new_h
        # one side is the target's; the other keeps w/h up to its truncation (< 1 pixel)
        assert new_w == tw or new_h == th
        truncated = new_w / (new_h * (new_h + 1)) if new_w == tw else 1 / new_h
        assert abs(new_w / new_h - w / h) <= truncated + 1e-12, (w, h, th, tw)
    assert image_folder.crop_box((5, 9), (3, 4), "stretch") == ((4, 3), (0, 0, 4, 3))
    assert image_folder.crop_box((4, 3), (3, 4)) == ((4, 3), (0, 0, 4, 3))   # right size as is
    with pytest.raises(ValueError, match="resize='bogus'"):
        image_folder.crop_box((4, 3), (3, 4), "bogus")


# --------------------------------------------------------------------------------- pixels
def test_an_image_of_the_right_size_is_read_pixel_for_pixel(tmp_path):
    rng = np.random.default_rng(0)
    rgb, gray = _rgb(rng, 9, 7), rng.integers(0, 256, (9, 7), dtype=np.uint8)
    np.testing.assert_array_equal(
        image_folder.decode(_save(tmp_path / "c.png", rgb), 3, (9, 7)), rgb)
    np.testing.assert_array_equal(
        image_folder.decode(_save(tmp_path / "g.png", gray), 1, (9, 7)), gray[..., None])
    np.testing.assert_array_equal(   # no target: the file's own size
        image_folder.decode(tmp_path / "c.png", 3), rgb)


def test_colour_to_gray_is_the_601_luma_and_gray_to_colour_copies_it(tmp_path):
    rng = np.random.default_rng(1)
    rgb = np.concatenate([np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255]]],
                                   np.uint8), _rgb(rng, 1, 4)], axis=1)
    luma = rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114])   # ITU-R 601-2
    got = image_folder.decode(_save(tmp_path / "c.png", rgb), 1)[..., 0]
    assert np.abs(got.astype(np.float64) - luma).max() <= 1.0, (got, luma)
    assert got[0, :3].tolist() == [76, 150, 29]      # a channel swap fails here
    gray = rng.integers(0, 256, (3, 5), dtype=np.uint8)
    np.testing.assert_array_equal(image_folder.decode(_save(tmp_path / "g.png", gray), 3),
                                  np.repeat(gray[..., None], 3, axis=2))


def test_alpha_is_dropped_and_a_palette_is_expanded(tmp_path):
    rng = np.random.default_rng(2)
    rgba = rng.integers(0, 256, (4, 6, 4), dtype=np.uint8)
    np.testing.assert_array_equal(
        image_folder.decode(_save(tmp_path / "a.png", rgba, "RGBA"), 3), rgba[..., :3])
    palette = rng.integers(0, 256, (256, 3), dtype=np.uint8)
    index = rng.integers(0, 256, (5, 3), dtype=np.uint8)
    image = Image.fromarray(index, "P")
    image.putpalette(palette.ravel().tolist())
    image.save(tmp_path / "p.png")
    np.testing.assert_array_equal(image_folder.decode(tmp_path / "p.png", 3), palette[index])


def _blocks(widths, colours, h):
    return np.concatenate([np.broadcast_to(np.array(c, np.uint8), (h, w, 3))
                           for w, c in zip(widths, colours, strict=True)], axis=1)


def test_crop_keeps_the_centre_and_stretch_the_whole_width(tmp_path):
    """64 x 32: three colour blocks of 16, 32 and 16 columns. "crop" to 16 x 16 halves it
    (32 x 16) and cuts columns 8..24: the middle block only, up to the filter's edge
    columns. "stretch" keeps both outer blocks."""
    a, b, c = (200, 10, 10), (10, 200, 10), (10, 10, 200)
    path = _save(tmp_path / "wide.png", _blocks([16, 32, 16], [a, b, c], 32))
    crop = image_folder.decode(path, 3, (16, 16), "crop")
    assert crop.shape == (16, 16, 3)
    np.testing.assert_array_equal(crop[:, 1:-1], np.broadcast_to(b, (16, 14, 3)))
    stretch = image_folder.decode(path, 3, (16, 16), "stretch")
    np.testing.assert_array_equal(stretch[:, :3], np.broadcast_to(a, (16, 3, 3)))
    np.testing.assert_array_equal(stretch[:, 6:10], np.broadcast_to(b, (16, 4, 3)))
    np.testing.assert_array_equal(stretch[:, -3:], np.broadcast_to(c, (16, 3, 3)))
    # a constant image stays constant under any resize
    flat = _save(tmp_path / "flat.png", np.full((37, 23, 3), 77, np.uint8))
    for mode in image_folder.RESIZE_MODES:
        assert set(np.unique(image_folder.decode(flat, 3, (28, 28), mode))) == {77}


# ------------------------------------------------------------------------ OOD set, files
def test_an_ood_folder_is_every_image_at_any_depth_in_path_order(tmp_path):
    rng = np.random.default_rng(3)
    root = tmp_path / "ood"
    names = ["b/x/1.png", "a.png", "a/2.PNG", "b/0.jpg", "a/1.bmp"]
    for i, n in enumerate(names):
        _save(root / n, np.full((6, 6, 3), 10 * i, np.uint8) if n.endswith(".jpg")
              else _rgb(rng, 6, 6))
    _save(root / ".hidden.png", _rgb(rng, 6, 6))
    _save(root / "._mac.png", _rgb(rng, 6, 6))
    (root / "notes.txt").write_text("not an image")
    (root / ".git").mkdir()
    _save(root / ".git" / "x.png", _rgb(rng, 6, 6))
    assert [p.relative_to(root).as_posix() for p in image_folder.list_images(root)] == \
        sorted(names)
    ood = data.load_own_ood(f"images:{root}", like=(6, 6, 3), cache_dir=tmp_path / "cache")
    assert (ood.images.shape, ood.images.dtype, ood.labels.tolist()) == \
        ((5, 6, 6, 3), np.uint8, [0] * 5)
    for i, n in enumerate(sorted(names)):
        if not n.endswith(".jpg"):
            np.testing.assert_array_equal(ood.images[i], np.asarray(Image.open(root / n)))


def test_a_subset_decodes_only_the_examples_split_subset_keeps(tmp_path):
    rng = np.random.default_rng(8)
    for i in range(11):
        _save(tmp_path / "ood" / f"{i:02d}.png", _rgb(rng, 5, 5))
    whole = data.load_own_ood(f"images:{tmp_path / 'ood'}", like=(5, 5, 3),
                              cache_dir=tmp_path / "cache")
    for n in (1, 4, 10, 11, 30):
        part = data.load_own_ood(f"images:{tmp_path / 'ood'}", like=(5, 5, 3),
                                 cache_dir=tmp_path / "cache", num_examples=n)
        np.testing.assert_array_equal(part.images, whole.subset(n).images, err_msg=str(n))


def test_an_ood_folder_is_cached_and_read_again_when_a_file_changes(tmp_path):
    rng = np.random.default_rng(4)
    root, cache = tmp_path / "ood", tmp_path / "cache"
    for i in range(3):   # BMP: the same size in bytes whatever the pixels
        _save(root / f"{i}.bmp", _rgb(rng, 10, 12))
    first = data.load_own_ood(f"images:{root}", like=(8, 8, 1), cache_dir=cache)
    again = data.load_own_ood(f"images:{root}", like=(8, 8, 1), cache_dir=cache)
    assert (first.source, again.source) == ("image_folder", "image_folder+cache")
    np.testing.assert_array_equal(first.images, again.images)
    stretched = data.load_own_ood(f"images:{root}", like=(8, 8, 1), cache_dir=cache,
                                  image_resize="stretch")   # another entry, not the crop's
    assert stretched.source == "image_folder" and not np.array_equal(stretched.images,
                                                                     first.images)
    size = (root / "1.bmp").stat().st_size
    _save(root / "1.bmp", np.zeros((10, 12, 3), np.uint8))
    assert (root / "1.bmp").stat().st_size == size
    changed = data.load_own_ood(f"images:{root}", like=(8, 8, 1), cache_dir=cache)
    assert changed.source == "image_folder"
    np.testing.assert_array_equal(changed.images[1], 0)
    np.testing.assert_array_equal(changed.images[[0, 2]], first.images[[0, 2]])


def test_what_an_ood_folder_refuses_is_one_line_naming_it(tmp_path):
    rng = np.random.default_rng(5)
    cache = tmp_path / "cache"

    def load(folder, like=(8, 8, 3), **kw):
        return data.load_own_ood(f"images:{folder}", like=like, cache_dir=cache, **kw)

    cases = []
    with pytest.raises(data.MissingDataError, match="no such folder") as e:
        load(tmp_path / "absent")
    cases.append(e)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("x")
    with pytest.raises(data.MissingDataError, match="holds no image files") as e:
        load(tmp_path / "empty")
    cases.append(e)
    _save(tmp_path / "bad" / "0.png", _rgb(rng, 8, 8))
    (tmp_path / "bad" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    with pytest.raises(data.CorruptDataError, match=r"1\.png: not a readable image") as e:
        load(tmp_path / "bad")
    cases.append(e)
    Image.fromarray(np.full((8, 8), 40000, np.uint16)).save(_dir(tmp_path / "deep") / "0.png")
    with pytest.raises(data.CorruptDataError, match="more than 8 bits") as e:
        load(tmp_path / "deep")
    cases.append(e)
    # Pillow's decompression-bomb guard (here lowered: 40 x 40 is over twice 700 pixels)
    _save(tmp_path / "bomb" / "0.png", _rgb(rng, 40, 40))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(Image, "MAX_IMAGE_PIXELS", 700)
        with pytest.raises(data.CorruptDataError, match=r"0\.png: .*Downscale the image") as e:
            load(tmp_path / "bomb")
        cases.append(e)
        (tmp_path / "bomb_ds" / "train" / "a").mkdir(parents=True)
        (tmp_path / "bomb_ds" / "test" / "a").mkdir(parents=True)
        for split in ("train", "test"):   # a dataset reads the training headers first
            _save(tmp_path / "bomb_ds" / split / "a" / "0.png", _rgb(rng, 40, 40))
        with pytest.raises(data.CorruptDataError, match="Downscale the image") as e:
            data.load_own(f"images:{tmp_path / 'bomb_ds'}", cache_dir=cache)
        cases.append(e)
    _save(tmp_path / "ok" / "0.png", _rgb(rng, 8, 8))
    for like, match in [((12,), r"\(12,\)"), ((8, 8, 4), r"\(8, 8, 4\)")]:
        with pytest.raises(ValueError, match=match) as e:
            load(tmp_path / "ok", like=like)
        cases.append(e)
    with pytest.raises(ValueError, match="resize='fit'") as e:
        load(tmp_path / "ok", image_resize="fit")
    cases.append(e)
    with pytest.raises(ValueError, match="needs `like`"):
        data.load_own_ood(f"images:{tmp_path / 'ok'}")
    with pytest.raises(ValueError, match="images:<folder"):
        data.load_own_ood("images: ", like=(8, 8, 3))
    assert all("\n" not in str(e.value) for e in cases)


def _dir(path):
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_an_idx_folder_name_that_holds_images_points_to_images_prefix(tmp_path):
    _save(tmp_path / "pics" / "0.png", np.zeros((4, 4), np.uint8))
    with pytest.raises(data.MissingDataError, match="name it images:<folder>"):
        data.load_ood(tmp_path / "pics")


# ------------------------------------------------------------------------------ dataset
def _write_dataset(root, sizes=(10, 8), classes=("cat", "ant", "bee"), per_class=4,
                   mode="L", val=False, seed=6):
    rng = np.random.default_rng(seed)
    shape = sizes if mode == "L" else sizes + (3,)
    written = {}
    for split, n in (("train", per_class), ("test", 2)) + ((("val", 1),) if val else ()):
        for c in classes:
            for i in range(n):
                pixels = rng.integers(0, 256, shape, dtype=np.uint8)
                written[(split, c, i)] = _save(root / split / c / f"{i}.png", pixels)
    return written


def test_an_image_folder_dataset_has_sorted_classes_and_their_labels(tmp_path):
    root = tmp_path / "ds"
    written = _write_dataset(root)
    ds = data.load_own(f"images:{root}", cache_dir=tmp_path / "cache")
    assert ds.num_classes == 3 and ds.validation is None
    assert (ds.train.images.shape, ds.test.images.shape) == ((12, 10, 8, 1), (6, 10, 8, 1))
    classes = sorted(("cat", "ant", "bee"))
    want_labels = [k for k in range(3) for _ in range(4)]
    assert ds.train.labels.tolist() == want_labels
    for j, (k, i) in enumerate((k, i) for k in range(3) for i in range(4)):
        np.testing.assert_array_equal(
            ds.train.images[j, ..., 0], np.asarray(Image.open(written[("train", classes[k], i)])))
    _write_dataset(tmp_path / "rgb", mode="RGB", val=True)
    rgb = data.load_own(f"images:{tmp_path / 'rgb'}", cache_dir=tmp_path / "cache")
    assert rgb.train.image_shape == (10, 8, 3) and len(rgb.validation) == 3


def test_a_dataset_is_colour_when_any_training_image_is_and_a_cached_one_opens_no_header(
        tmp_path, monkeypatch):
    from gedl_jax.data import image_folder

    root, cache = tmp_path / "ds", tmp_path / "cache"
    _write_dataset(root)
    assert data.load_own(f"images:{root}", cache_dir=cache).train.image_shape == (10, 8, 1)
    opened = []
    real = image_folder._is_gray
    monkeypatch.setattr(image_folder, "_is_gray", lambda f: opened.append(f) or real(f))
    again = data.load_own(f"images:{root}", cache_dir=cache)
    assert again.train.source == "image_folder+cache" and opened == []
    # one colour image, last in file order, among grayscale ones: the files changed, every
    # header is read again and the dataset becomes RGB (its gray images replicated)
    last = sorted((root / "train").rglob("*.png"))[-1]
    gray = np.asarray(Image.open(last))
    colour = np.stack([gray, gray, gray], axis=-1)
    colour[0, 0] = (255, 0, 0)
    _save(last, colour)
    rgb = data.load_own(f"images:{root}", cache_dir=cache)
    assert rgb.train.image_shape == (10, 8, 3) and len(opened) == len(rgb.train)
    np.testing.assert_array_equal(rgb.train.images[0], np.repeat(again.train.images[0], 3, -1))
    np.testing.assert_array_equal(rgb.train.images[-1], colour)


def test_what_an_image_folder_dataset_refuses(tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(data.MissingDataError, match="needs train/ and test/"):
        data.load_own(f"images:{_dir(tmp_path / 'flat')}", cache_dir=cache)
    _write_dataset(tmp_path / "sizes")
    _save(tmp_path / "sizes" / "train" / "bee" / "9.png", np.zeros((11, 8), np.uint8))
    with pytest.raises(data.CorruptDataError, match="must have one size"):
        data.load_own(f"images:{tmp_path / 'sizes'}", cache_dir=cache)
    _write_dataset(tmp_path / "test_size")
    _save(tmp_path / "test_size" / "test" / "bee" / "0.png", np.zeros((11, 8), np.uint8))
    with pytest.raises(data.CorruptDataError, match="must have one size"):
        data.load_own(f"images:{tmp_path / 'test_size'}", cache_dir=cache)
    _write_dataset(tmp_path / "unknown")
    _save(tmp_path / "unknown" / "test" / "dog" / "0.png", np.zeros((10, 8), np.uint8))
    with pytest.raises(data.CorruptDataError, match=r"\['dog'\] are not among"):
        data.load_own(f"images:{tmp_path / 'unknown'}", cache_dir=cache)
    _write_dataset(tmp_path / "empty_class")
    _dir(tmp_path / "empty_class" / "train" / "dog")
    with pytest.raises(data.CorruptDataError, match="a training class without image files"):
        data.load_own(f"images:{tmp_path / 'empty_class'}", cache_dir=cache)


# --------------------------------------------------------------------------- run engine
def test_the_run_engine_trains_on_an_image_folder_and_resizes_an_ood_folder(tmp_path):
    root = tmp_path / "ds"
    _write_dataset(root, sizes=(12, 12), per_class=10)
    rng = np.random.default_rng(7)
    for i in range(5):
        _save(tmp_path / "far" / f"{i}.jpg", _rgb(rng, 30 + i, 20))
    c = configs.build_config("custom", "gedl")
    config_lib.set_fields(c, dataset=f"images:{root}", model="mlp", batch_size=8,
                             ood_datasets=f"images:{tmp_path / 'far'}",
                             cache_dir=str(tmp_path / "cache"), image_resize="stretch")
    experiment.resolve_own_data(c)
    config_lib.validate(c)
    assert c.num_classes == 3
    official = experiment.OfficialData.load(c)
    far = official.ood[f"images:{tmp_path / 'far'}"]
    assert far.images.shape == (5, 12, 12, 1)
    np.testing.assert_array_equal(far.images[0], image_folder.decode(
        tmp_path / "far" / "0.jpg", 1, (12, 12), "stretch"))
    run = official.for_seed(c, 0)
    assert (len(run.train), len(run.validation), len(run.test)) == (24, 6, 6)
    config_lib.set_fields(c, image_resize="fit")
    with pytest.raises(ValueError, match="image_resize"):
        config_lib.validate(c)

