"""Your own data and network: any preset on an `.npz` file, a folder of image files or a prepared
TFDS dataset.

Usage:
  python -m gedl_jax.train --config=configs/custom.py:gedl,quick \
      --config.dataset=npz:my_data.npz --config.ood_datasets=npz:my_ood.npz \
      --config.model=mypkg.nets:SmallCNN --workdir=runs/mine
  python -m gedl_jax.train --config=configs/custom.py:duq --config.dataset=tfds:my_dataset \
      --config.model=resnet18 --config.tfds_data_dir=~/tensorflow_datasets
  python -m gedl_jax.train --config=configs/custom.py:gedl --config.dataset=images:my_images \
      --config.ood_datasets=images:textures --config.model=resnet18

Defaults (config.DATASET_DEFAULTS["custom"]): the MNIST family's optimiser settings
(Adam 1e-3, no weight decay, batch 128, 200 epochs, 20% of the training set validates unless the
file has val_images), no augmentation, no OOD sets unless named; K from the labels. The model
must be given (resnet18, mlp, or <importable.module>:<Name>); for vector data (N, D) it defaults
to the MLP. The `quick` modifier uses all the data for 2 epochs. docs/library.md has the file
format and the network contract.
"""

from gedl_jax.configs import build_config


def get_config(arg=None):
    return build_config("custom", arg)
