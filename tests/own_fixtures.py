"""A user's package and data outside the repository, for the tests of own networks and own data.

`write_user_package(root)` writes `root/userpkg/nets.py` with three networks meeting the contract
of `gedl_jax.networks.user`: `LinenCNN` (BatchNorm with `axis_name`, a `features` method, no
dropout switch), `NNXCNN` (NNX, `features`, dropout) and `MLP` (vectors, `features`), and
`NoFeatures` (logits only), `SquashedHead` (features, logits not linear in them) and
`BrokenFeatures` (a `features` method breaking the contract). `write_image_data` /
`write_vector_data` write `.npz` datasets with a learnable signal and an OOD set of the same
shape.
"""

from __future__ import annotations

import pathlib
import textwrap

import numpy as np

NETS = textwrap.dedent('''
    import flax.linen as nn
    from flax import nnx


    class LinenCNN(nn.Module):
        num_classes: int
        axis_name: str | None = None

        def setup(self):
            self.conv = nn.Conv(8, (3, 3))
            self.bn = nn.BatchNorm(momentum=0.9, axis_name=self.axis_name)
            self.hidden = nn.Dense(16)
            self.head = nn.Dense(self.num_classes)

        def features(self, x, train=False):
            x = nn.relu(self.bn(self.conv(x), use_running_average=not train))
            return nn.relu(self.hidden(x.reshape(x.shape[0], -1)))

        def __call__(self, x, train=False):
            return self.head(self.features(x, train))


    class NNXCNN(nnx.Module):
        def __init__(self, num_classes, rngs):
            self.conv = nnx.Conv(1, 8, (3, 3), rngs=rngs)
            self.hidden = nnx.Linear(8 * 8 * 8, 16, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)
            self.head = nnx.Linear(16, num_classes, rngs=rngs)

        def features(self, x):
            x = nnx.relu(self.conv(x))
            return self.drop(nnx.relu(self.hidden(x.reshape(x.shape[0], -1))))

        def __call__(self, x):
            return self.head(self.features(x))


    class MLP(nn.Module):
        num_classes: int
        width: int = 32

        def setup(self):
            self.hidden = nn.Dense(self.width)
            self.head = nn.Dense(self.num_classes)

        def features(self, x, train=False):
            return nn.relu(self.hidden(x))

        def __call__(self, x, train=False):
            return self.head(self.features(x, train))


    class NoFeatures(nn.Module):
        num_classes: int

        @nn.compact
        def __call__(self, x, train=False):
            return nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))


    class SquashedHead(nn.Module):
        """Features, but logits that no linear layer computes from them."""
        num_classes: int

        def setup(self):
            self.hidden = nn.Dense(16)
            self.head = nn.Dense(self.num_classes)

        def features(self, x, train=False):
            return nn.relu(self.hidden(x.reshape(x.shape[0], -1)))

        def __call__(self, x, train=False):
            return 3.0 * nn.tanh(self.head(self.features(x, train)))


    class BrokenFeatures(nn.Module):
        """A `features` method that breaks the contract: one example's features, no batch."""
        num_classes: int

        def setup(self):
            self.hidden = nn.Dense(16)
            self.head = nn.Dense(self.num_classes)

        def features(self, x, train=False):
            return nn.relu(self.hidden(x.reshape(x.shape[0], -1)))[0]

        def __call__(self, x, train=False):
            return self.head(nn.relu(self.hidden(x.reshape(x.shape[0], -1))))
''')


def write_user_package(root: pathlib.Path) -> pathlib.Path:
    """root/userpkg/{__init__,nets}.py; returns root (the folder to put on PYTHONPATH)."""
    pkg = root / "userpkg"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text(NETS)
    return root


def _images(rng, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """8x8x1 uint8 images: class c lights up rows 2c, 2c+1 over noise."""
    labels = np.arange(n) % k
    images = rng.integers(0, 80, (n, 8, 8, 1)).astype(np.uint8)
    for c in range(k):
        images[labels == c, 2 * c:2 * c + 2] = 255
    return images, labels


def write_image_data(root: pathlib.Path, n_train: int = 256, n_test: int = 64, k: int = 3,
                     seed: int = 0) -> tuple[pathlib.Path, pathlib.Path]:
    """(dataset .npz, OOD .npz) of 8x8x1 images; the OOD set is uniform noise."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    x, y = _images(rng, n_train, k)
    xt, yt = _images(rng, n_test, k)
    np.savez(root / "images.npz", train_images=x, train_labels=y, test_images=xt,
             test_labels=yt)
    np.savez(root / "images_ood.npz",
             test_images=rng.integers(0, 256, (48, 8, 8, 1)).astype(np.uint8))
    return root / "images.npz", root / "images_ood.npz"


def write_vector_data(root: pathlib.Path, n_train: int = 256, n_test: int = 64, k: int = 3,
                      seed: int = 0) -> tuple[pathlib.Path, pathlib.Path]:
    """(dataset .npz, OOD .npz) of 2-D vectors: three Gaussian classes, OOD points far away."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    centres = np.array([[0.0, 3.0], [-3.0, -2.0], [3.0, -2.0]])

    def draw(n):
        y = np.arange(n) % k
        return (centres[y] + rng.normal(0, 0.7, (n, 2))).astype(np.float32), y

    (x, y), (xt, yt) = draw(n_train), draw(n_test)
    np.savez(root / "vectors.npz", train_images=x, train_labels=y, test_images=xt,
             test_labels=yt)
    np.savez(root / "vectors_ood.npz",
             test_images=(rng.normal(0, 1, (48, 2)) + 12.0).astype(np.float32))
    return root / "vectors.npz", root / "vectors_ood.npz"
