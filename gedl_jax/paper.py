"""The paper's numbers: its main table (Table results, with Table additional_baselines' rows of
RED, DAEDL and F-EDL) and its CIFAR-10 calibration table (Table calibration_cifar10), as printed.

Read by `bin/reproduce.py` (the tables it writes beside ours), the studies that set runs beside
the paper and the tests that check the results prose. Values in % for accuracy and AUPR (the
OOD columns with the in-distribution set positive), fractions for ECE and Brier; None where the
paper prints "--" (no UM for MC Dropout and DUQ). Imports nothing.

>>> PAPER["cifar10"]["columns"][2], PAPER["cifar10"]["gedl"][2], PAPER_STD["cifar10"]["gedl"][2]
('SVHN MP', 89.26, 3.26)
>>> CALIBRATION["cifar10"]["gedl"], CALIBRATION_STD["cifar10"]["gedl"]
([0.0464, 0.1525], [0.0065, 0.0071])
"""

from __future__ import annotations

# Mean over the paper's runs (5 seeds for the EDL family and GEDL; the rows it copied from
# earlier papers, and its appendix runs of RED, DAEDL and F-EDL, one run each, as it says).
PAPER: dict[str, dict[str, list]] = {
    "mnist": {
        "columns": ["Acc", "Conf.MP", "KMNIST MP", "KMNIST UM", "FMNIST MP", "FMNIST UM"],
        "edl": [98.22, 99.99, 97.02, 96.31, 98.11, 98.08],
        "iedl": [99.21, 99.98, 98.34, 98.33, 98.89, 98.86],
        "redl": [99.33, 99.99, 98.69, 98.69, 99.29, 99.29],
        "red": [99.38, 99.97, 98.71, 97.24, 99.34, 98.78],
        "gedl": [99.58, 99.95, 99.80, 99.70, 98.54, 98.99],
        # Copied by the paper from earlier papers (no UM for MC Dropout and DUQ), and its
        # appendix runs of DAEDL and F-EDL with their authors' code (one run each).
        "mc_dropout": [99.26, 99.98, 94.00, None, 96.56, None],
        "duq": [98.65, 99.97, 98.52, None, 97.92, None],
        "kl_pn": [99.01, 99.92, 92.97, 93.39, 98.44, 98.16],
        "rkl_pn": [99.21, 99.67, 60.76, 53.76, 78.45, 72.18],
        "postnet": [99.34, 99.98, 95.75, 94.59, 97.78, 97.24],
        "daedl": [99.43, 99.99, 98.92, 98.86, 99.40, 99.54],
        "fedl": [99.48, 99.99, 99.02, 96.71, 99.66, 94.51],
    },
    "cifar10": {
        "columns": ["Acc", "Conf.MP", "SVHN MP", "SVHN UM", "CIFAR-100 MP", "CIFAR-100 UM"],
        "edl": [83.55, 97.86, 78.87, 79.12, 84.30, 84.18],
        "iedl": [89.20, 98.72, 83.26, 82.96, 85.35, 84.84],
        "redl": [90.09, 98.98, 85.00, 85.00, 87.72, 87.73],
        "red": [89.80, 98.63, 90.10, 89.92, 84.97, 84.62],
        "gedl": [90.22, 97.15, 89.26, 92.56, 88.27, 85.42],
        "mc_dropout": [82.84, 97.15, 51.39, None, 45.57, None],
        "duq": [89.33, 97.89, 80.23, None, 84.75, None],
        "kl_pn": [27.46, 50.61, 43.96, 43.23, 61.41, 61.53],
        "rkl_pn": [64.76, 86.11, 53.61, 49.37, 55.42, 54.74],
        "postnet": [84.85, 97.76, 80.21, 77.71, 81.96, 82.06],
        "daedl": [90.06, 98.80, 85.28, 85.30, 84.34, 84.50],
        "fedl": [91.29, 99.10, 88.57, 61.04, 88.18, 68.79],
    },
}

# The "±" the paper prints beside each mean (its std over runs); rows it prints without one
# (single runs) are absent.
PAPER_STD: dict[str, dict[str, list]] = {
    "mnist": {
        "edl": [0.31, 0.00, 0.76, 2.03, 0.44, 0.42],
        "iedl": [0.08, 0.00, 0.24, 0.24, 0.28, 0.29],
        "redl": [0.03, 0.00, 0.19, 0.20, 0.11, 0.12],
        "gedl": [0.02, 0.01, 0.01, 0.04, 0.13, 0.05],
        "mc_dropout": [0.00, 0.00, 0.10, None, 0.30, None],
        "duq": [0.10, 0.00, 0.10, None, 0.60, None],
        "kl_pn": [0.00, 0.00, 1.20, 1.00, 0.10, 0.00],
        "rkl_pn": [0.00, 0.00, 2.90, 3.40, 3.10, 3.60],
        "postnet": [0.00, 0.00, 0.20, 0.30, 0.20, 0.30],
    },
    "cifar10": {
        "edl": [0.64, 0.17, 3.50, 3.69, 0.67, 0.74],
        "iedl": [0.32, 0.12, 2.44, 2.17, 0.69, 0.64],
        "redl": [0.30, 0.05, 1.22, 1.22, 0.31, 0.31],
        "gedl": [0.49, 3.72, 3.26, 6.02, 2.51, 5.14],
        "mc_dropout": [0.10, 0.00, 0.10, None, 1.00, None],
        "duq": [0.20, 0.30, 3.40, None, 1.10, None],
        "kl_pn": [1.70, 4.00, 1.90, 2.30, 2.80, 3.40],
        "rkl_pn": [0.30, 0.40, 1.10, 0.80, 2.60, 2.80],
        "postnet": [0.00, 0.00, 0.20, 0.30, 0.80, 0.80],
    },
}

# Table calibration_cifar10: ECE (15 bins, as the R-EDL code's _ECELoss) and Brier on the
# CIFAR-10 test set; GEDL's over 5 runs, the others single runs.
CALIBRATION: dict[str, dict[str, list]] = {
    "cifar10": {
        "columns": ["ECE", "Brier"],
        "edl": [0.1294, 0.1965],
        "iedl": [0.3858, 0.3145],
        "redl": [0.0534, 0.1820],
        "red": [0.0497, 0.1720],
        "daedl": [0.0443, 0.1622],
        "fedl": [0.0408, 0.1348],
        "gedl": [0.0464, 0.1525],
    },
}
CALIBRATION_STD: dict[str, dict[str, list]] = {"cifar10": {"gedl": [0.0065, 0.0071]}}

# The methods of the main table that the toolkit trains, the EDL family first.
MAIN_METHODS = ("gedl", "edl", "iedl", "redl", "red", "mc_dropout", "softmax", "duq", "kl_pn",
                "rkl_pn", "postnet", "daedl", "fedl")

