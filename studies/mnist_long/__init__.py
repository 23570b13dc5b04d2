"""The long MNIST study's scripts (studies/README.md): `studies.mnist_long.<name>`."""
